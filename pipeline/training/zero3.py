"""The output layer's weights in full for the loss under DeepSpeed ZeRO-3 (issue 17).

ZeRO-3 partitions every parameter across the processes (each holds a shard; `param.data` is empty)
and gathers a module's parameters only inside that module's forward, by hooks. The token loss
(pipeline/training/token_loss.py) reads `lm_head.weight` directly and never calls the `lm_head`
module, so no hook fires and the loss would see an empty shard: the bug TRL fixed by gathering the
head with `deepspeed.zero.GatheredParameters` for the direct read (TRL #3368, fixed in #5891 and
#6372, `trl.trainer.utils.maybe_gather_lm_head_ctx`). Gathered read-only (no `modifier_rank`):
nothing is written back. Both losses (`liger`, `chunked`) compute the weight's gradient during the
forward, while it is whole, so the backward needs no second gather. That dense gradient reaches a
parameter that is a shard again; ZeRO-3 accumulates and reduces it only when the loss ran inside the
DeepSpeed engine's forward, with its hooks armed (TRL #6372: otherwise "size of tensor a (0) must
match the size of tensor b"). It does: `install_token_loss` makes the loss the model's own forward,
which the engine calls.
"""

import contextlib


def zero3_partitioned(parameters) -> list:
    """The parameters among `parameters` that ZeRO-3 holds partitioned, each once.

    A ZeRO-3 parameter carries `ds_id` and `ds_status` (DeepSpeed's `ZeroParamStatus`); one already
    AVAILABLE (gathered by a module still in its forward, or kept whole because it is small) is left
    alone: gathering it again would re-partition it on exit under the module that gathered it (TRL's
    note on tied embeddings). Compared by name, so telling a ZeRO-3 parameter needs no deepspeed import.
    A parameter passed twice (a tied head, a weight and its bias) is gathered once: ZeRO-3 mishandles
    duplicates in a gather list."""
    found: dict[int, object] = {}
    for parameter in parameters:
        if parameter is None or not hasattr(parameter, "ds_id"):
            continue
        if getattr(parameter.ds_status, "name", parameter.ds_status) != "AVAILABLE":
            found.setdefault(id(parameter), parameter)
    return list(found.values())


def full_parameters(*parameters):
    """A context in which `parameters` (None entries ignored) hold their full values: a gather of the
    ZeRO-3-partitioned ones, a no-op context when there are none (no DeepSpeed, DDP, FSDP, one device)."""
    partitioned = zero3_partitioned(parameters)
    if not partitioned:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(partitioned)
