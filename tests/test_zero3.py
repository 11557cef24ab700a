"""The token loss reads the output layer in full under DeepSpeed ZeRO-3, and changes nothing elsewhere (issue 17.3).

DeepSpeed is not installed here (nor in the GPU image): its part is played by a stand-in `deepspeed`
module whose `zero.GatheredParameters` does what ZeRO-3's gather does to one process's view of a
parameter (the full tensor in `.data` inside the context, an empty shard outside), and by parameters
marked as ZeRO-3 ones (`ds_id`, `ds_status`). What ran on real ZeRO-3: nothing yet (README).
"""

import contextlib
import enum
import sys
import types

import pytest
import torch
from test_packing import ListSequences, random_sequences, unpacked_loss

from pipeline.training.packing import PackedCollator, PackedSequences
from pipeline.training.token_loss import install_token_loss
from pipeline.training.zero3 import full_parameters, zero3_partitioned


class ZeroParamStatus(enum.Enum):  # deepspeed.runtime.zero.partition_parameters.ZeroParamStatus
    AVAILABLE = 1
    NOT_AVAILABLE = 2
    INFLIGHT = 3


def zero3_parameter(status: ZeroParamStatus):
    parameter = torch.nn.Parameter(torch.zeros(0))
    parameter.ds_id, parameter.ds_status = 7, status
    return parameter


plain = torch.nn.Parameter(torch.ones(3))
partitioned = zero3_parameter(ZeroParamStatus.NOT_AVAILABLE)
inflight = zero3_parameter(ZeroParamStatus.INFLIGHT)
gathered = zero3_parameter(ZeroParamStatus.AVAILABLE)


@pytest.mark.parametrize(
    "parameters, expected",
    [
        ((plain, None), []),  # no ZeRO-3: nothing to gather
        ((partitioned, None), [partitioned]),  # a head without bias
        ((partitioned, inflight), [partitioned, inflight]),  # weight and bias, a prefetch under way
        ((gathered, partitioned), [partitioned]),  # already whole (a module in its forward, or persistent)
        ((partitioned, partitioned), [partitioned]),  # the same parameter twice: gathered once
        ((plain, partitioned), [partitioned]),
    ],
)
def test_only_zero3_partitioned_parameters_are_gathered(parameters, expected):
    assert zero3_partitioned(parameters) == expected


def test_without_zero3_the_context_is_a_no_op_and_deepspeed_is_not_imported(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # an import would raise
    layer = torch.nn.Linear(4, 3)
    before = layer.weight.detach().clone()
    with full_parameters(layer.weight, layer.bias) as entered:
        assert entered is None and torch.equal(layer.weight, before)
    assert isinstance(full_parameters(layer.weight, None), contextlib.nullcontext)


class FakeZero3:
    """One process's view of ZeRO-3 for the parameters it partitions: an empty shard in `.data`, the full
    tensor only inside `GatheredParameters`; installed as the `deepspeed` module."""

    def __init__(self, monkeypatch):
        self.full = {}
        self.gathers = []
        fake = self

        class GatheredParameters:
            def __init__(self, params, modifier_rank=None):
                assert modifier_rank is None  # read-only: nothing is broadcast back on exit
                self.params = list(params)
                fake.gathers.append(self.params)

            def __enter__(self):
                for p in self.params:
                    p.data, p.ds_status = fake.full[id(p)], ZeroParamStatus.AVAILABLE

            def __exit__(self, *exc):
                for p in self.params:
                    p.data, p.ds_status = torch.empty(0, dtype=p.dtype), ZeroParamStatus.NOT_AVAILABLE

        module = types.ModuleType("deepspeed")
        module.zero = types.SimpleNamespace(GatheredParameters=GatheredParameters)
        monkeypatch.setitem(sys.modules, "deepspeed", module)

    def partition(self, parameter):
        self.full[id(parameter)] = parameter.data
        parameter.data = torch.empty(0, dtype=parameter.dtype)
        parameter.ds_id, parameter.ds_status = len(self.full), ZeroParamStatus.NOT_AVAILABLE


def untied_model(seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config)


@pytest.mark.parametrize("per_row", [False, True])
def test_a_partitioned_head_is_gathered_for_the_loss(monkeypatch, per_row):
    sequences = random_sequences([30, 20, 11, 45], keep=0.5)
    reference = untied_model()
    expected = unpacked_loss(reference, sequences)
    expected.backward()

    zero3 = FakeZero3(monkeypatch)
    model = untied_model()
    install_token_loss(model, "chunked")
    head = model.get_output_embeddings().weight
    zero3.partition(head)
    rows = PackedSequences(ListSequences(sequences), 64, seed=0)
    batch = PackedCollator(0, 64)([rows[i] for i in range(len(rows))])
    outputs = model(**batch, per_row=per_row)
    assert zero3.gathers == [[head]] and head.numel() == 0  # gathered once, for the read, and released
    if per_row:
        loss = outputs["row_loss_sums"].sum() / outputs["row_label_counts"].sum()
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        return
    loss = outputs["loss_sum"] / outputs["label_count"]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    # The head's gradient was computed in the forward, while the weight was whole. Accumulating it into a
    # parameter is ZeRO-3's business (its hooks, armed by the engine's forward, TRL #6372); the stand-in gives the
    # parameter its shape back for that, and checks the gradient itself.
    head.data = zero3.full[id(head)]
    loss.backward()
    torch.testing.assert_close(head.grad, reference.get_output_embeddings().weight.grad, rtol=1e-4, atol=1e-6)
