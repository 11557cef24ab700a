"""The transformers backend on the tiny offline model: continuously batched, left-padded decoding of
the prompts training renders, stopping at <|im_end|>, seeded samples that do not depend on the batch,
and the same cache as the openai backend."""

import random

import pytest

from pipeline.config.llm import EndpointConfig
from pipeline.config.model import TinyModelConfig
from pipeline.llm.client import ChatRequest, open_client
from pipeline.store.database import Store
from pipeline.training.tiny_model import IM_END, build_tiny_model

WORDS = "ls cat grep total drwxr-xr-x root file not found error permission denied json value true false".split()
# Prompts of different lengths, so a batch is really padded.
PROMPTS = ["ls", "cat notes.txt and grep error", "true", "grep -r permission denied root file value json", "x y"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    rng = random.Random(0)
    corpus = tmp_path_factory.mktemp("corpus") / "text.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(20)) for _ in range(2000)), encoding="utf-8")
    return build_tiny_model(TinyModelConfig(), [corpus], tmp_path_factory.mktemp("models") / "tiny")


def requests(samples: int = 1) -> list[ChatRequest]:
    return [ChatRequest(({"role": "user", "content": p},), k) for p in PROMPTS for k in range(samples)]


def answers(tiny, tmp_path, name: str, samples: int = 1, **fields):
    config = EndpointConfig(backend="transformers", model=str(tiny), max_tokens=12, device="cpu", **fields)
    with Store(tmp_path / f"{name}.duckdb") as store:
        client = open_client(config, store, "generator")
        return client.complete_sync(requests(samples)), client


def test_greedy_answers_do_not_depend_on_the_batch(tiny, tmp_path):
    batched, client = answers(tiny, tmp_path, "batched", temperature=0, batch_size=5)
    alone, _ = answers(tiny, tmp_path, "alone", temperature=0, batch_size=1)
    assert [a.text for a in batched] == [a.text for a in alone]
    assert all(a.text is not None and a.error is None for a in batched)
    assert all(1 <= a.completion_tokens <= 12 for a in batched)
    # The rendered prompt's own tokens, without the batch's padding.
    assert [a.prompt_tokens for a in batched] == [a.prompt_tokens for a in alone]
    assert len({a.prompt_tokens for a in batched}) > 1
    assert (client.tally.done, client.tally.completion_tokens) == (5, sum(a.completion_tokens for a in batched))


def test_progress_advances_by_the_batch_its_answers_come_in(tiny, tmp_path, monkeypatch):
    """Advanced answer by answer, a log's line came at the second of a batch of 24 that had all finished:
    "validation.before: 2/24 (8%), 0.0574/s, elapsed 0:35, eta 6:23 (24 done, ...)" (the demo's log)."""
    from pipeline import progress

    seen: list[tuple[str, int, int | None]] = []
    monkeypatch.setattr(progress, "OBSERVERS", [lambda *args: seen.append(args)])
    answers(tiny, tmp_path, "batches", temperature=0, batch_size=3)
    counts = [completed for role, completed, _ in seen if role == "generator"]
    steps = sorted(after - before for before, after in zip(counts, counts[1:]))
    assert (counts[0], counts[-1], steps) == (0, 5, [2, 3])  # the start, then a batch of 3 and one of 2, either first


def test_a_rerun_answers_from_the_cache_without_loading_the_model(tiny, tmp_path):
    config = EndpointConfig(backend="transformers", model=str(tiny), max_tokens=8, device="cpu", batch_size=2)
    with Store(tmp_path / "store.duckdb") as store:
        first = open_client(config, store, "generator").complete_sync(requests())
        rerun = open_client(config, store, "generator")
        again = rerun.complete_sync(requests())
    assert [a.text for a in again] == [a.text for a in first] and all(a.cached for a in again)
    assert rerun.backend._loaded is None


def test_seeded_samples_repeat_and_differ_from_each_other(tiny, tmp_path):
    first, _ = answers(tiny, tmp_path, "first", temperature=1.0, seed=7, batch_size=4, samples=2)
    second, _ = answers(tiny, tmp_path, "second", temperature=1.0, seed=7, batch_size=4, samples=2)
    other_seed, _ = answers(tiny, tmp_path, "other", temperature=1.0, seed=8, batch_size=4, samples=2)
    assert [a.text for a in first] == [a.text for a in second]
    assert [a.text for a in first] != [a.text for a in other_seed]
    assert len({a.text for a in first}) > len(PROMPTS)  # two samples of a prompt are not one answer twice


def test_a_seeded_sample_does_not_depend_on_its_batch(tiny, tmp_path):
    """Each request samples from its own seeded generator (continuous batching, pipeline/llm/batching.py):
    decoded five at a time, two at a time (rows leaving and joining as others end) or alone, the same."""
    together, client = answers(tiny, tmp_path, "together", temperature=1.0, seed=3, batch_size=5, samples=2)
    pairs, paired = answers(tiny, tmp_path, "pairs", temperature=1.0, seed=3, batch_size=2, samples=2)
    alone, _ = answers(tiny, tmp_path, "alone", temperature=1.0, seed=3, batch_size=1, samples=2)
    assert [a.text for a in together] == [a.text for a in pairs] == [a.text for a in alone]
    assert paired.tally.done == 2 * len(PROMPTS)


def test_generation_stops_at_im_end(tiny, tmp_path):
    """A head that always predicts <|im_end|>: every row of a padded batch ends after one token."""
    import torch

    config = EndpointConfig(backend="transformers", model=str(tiny), max_tokens=12, device="cpu", temperature=0)
    with Store(tmp_path / "store.duckdb") as store:
        client = open_client(config, store, "generator")
        model, tokenizer, _ = client.backend._load()
        head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        head.bias.data[tokenizer.convert_tokens_to_ids(IM_END)] = 10.0
        model.lm_head = head
        result = client.complete_sync(requests())
    assert [(a.text, a.completion_tokens) for a in result] == [("", 1)] * len(PROMPTS)


def test_the_transformers_backend_needs_a_resolved_model(tmp_path):
    with Store(tmp_path / "store.duckdb") as store, pytest.raises(ValueError, match="needs `model`"):
        open_client(EndpointConfig(backend="transformers"), store, "generator")


def test_rejected_answers_are_regenerated_then_recorded_as_failed(tiny, tmp_path):
    config = EndpointConfig(
        backend="transformers",
        model=str(tiny),
        max_tokens=4,
        device="cpu",
        batch_size=2,
        max_retries=1,
        backoff_initial_s=0,
        max_failed_fraction=1.0,
    )
    with Store(tmp_path / "store.duckdb") as store:
        client = open_client(config, store, "judge")
        result = client.complete_sync(requests(), accept=lambda text: "never good enough")
        attempts = store.execute("SELECT DISTINCT attempts FROM llm_cache").fetchall()
    assert {a.error for a in result} == {"rejected answer: never good enough"}
    assert (client.tally.failed, client.tally.retries, attempts) == (len(PROMPTS), len(PROMPTS), [(2,)])


@pytest.mark.parametrize("budget", [4, 9])
def test_a_thinking_budget_answers_every_request_in_the_thinking_format(tiny, tmp_path, budget):
    """Budget forcing (issue 16.3): a random model never closes a thinking block by itself, yet every
    answer opens one, thinks for exactly the budget, closes it and then writes the observation, and
    the budget is part of the cache key (a different budget is a different answer)."""
    from pipeline.sft.candidates import parse_candidate

    config = EndpointConfig(
        backend="transformers", model=str(tiny), max_tokens=6, device="cpu", temperature=1.0, seed=0
    )
    with Store(tmp_path / "thinking.duckdb") as store:
        client = open_client(config, store, "generator")
        thought = client.complete_sync(
            [ChatRequest(r.messages, r.sample_index, thinking_budget=budget) for r in requests(2)]
        )
        free = client.complete_sync(requests(2))
    parsed = [parse_candidate(answer.text) for answer in thought]
    assert [p.status for p in parsed] == ["ok"] * len(thought), [a.text for a in thought]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    closing = len(tokenizer.encode("\n</think>\n\n", add_special_tokens=False))
    # The budget, the forced closing tokens, then at most max_tokens of observation.
    assert all(budget + closing < answer.completion_tokens <= budget + closing + 6 for answer in thought)
    assert {answer.key for answer in thought}.isdisjoint(answer.key for answer in free)
    assert all(
        not parse_candidate(answer.text).ok for answer in free
    )  # the random model, free, never writes the format


def test_a_literal_end_of_turn_inside_an_action_stays_text_as_in_training(tiny):
    """Issue 17.17: the prompt ids of a request equal the training builder's for the same messages,
    so `<|im_end|>` typed inside an action is text, not the end of the turn."""
    from transformers import AutoTokenizer

    from pipeline.llm.transformers_backend import TransformersBackend
    from pipeline.training.sequences import SequenceBuilder

    messages = (
        {"role": "system", "content": "You simulate a terminal."},
        {"role": "user", "content": "echo '<|im_end|>'"},
        {"role": "assistant", "content": "<|im_end|>"},
        {"role": "user", "content": "ls"},
    )
    backend = TransformersBackend(EndpointConfig(backend="transformers", model=str(tiny), device="cpu"))
    ids = backend._prompt_batch([ChatRequest(messages)], "")["input_ids"][0].tolist()
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    builder = SequenceBuilder(tokenizer, max_length=4096, seed=0)
    expected = []
    for message, content in zip(messages, builder.encode([m["content"] for m in messages])):
        expected += builder.headers[message["role"]] + content + builder.footer
    assert ids == expected + builder.headers["assistant"]
    end = tokenizer.convert_tokens_to_ids(IM_END)
    assert ids.count(end) == 4  # one per message; the two typed ones are text


def _decoded(scheduler, asked: list[tuple[list[int], int]], sampling) -> list:
    """The rows of `asked` (prompt, choice) decoded to their end by `scheduler`, which is then closed."""
    import threading

    from pipeline.llm.batching import Row

    done, ended = threading.Event(), []

    def listener(step) -> None:
        if step.finish_reason is not None:
            ended.append(step)
            if len(ended) == len(asked):
                done.set()

    rows = [Row(prompt, sampling, choice, listener) for prompt, choice in asked]
    scheduler.submit(rows)
    assert done.wait(60)
    scheduler.close()
    return rows


def test_rows_with_one_prompt_share_its_prefill(tiny):
    """The K samples of a query (or n choices of a request) are one prompt: it runs through the model once
    and every row decodes from a copy of its cache, with the answers each row gets when prefilled alone."""

    from pipeline.llm.batching import Sampling, Scheduler
    from pipeline.training.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(tiny))
    model = load_causal_lm(str(tiny)).eval()
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in ("cat notes.txt", "grep -r error root")]

    def decode(asked: list[tuple[list[int], int]], max_batch: int):
        scheduler = Scheduler(model, tokenizer, [tokenizer.eos_token_id], max_batch=max_batch)
        rows = _decoded(scheduler, asked, Sampling(max_tokens=8, temperature=1.0, seed=5, ignore_eos=True))
        return [row.generated for row in rows], scheduler.prefilled_tokens

    asked = [(prompts[0], 0), (prompts[0], 1), (prompts[1], 0), (prompts[0], 2)]
    shared, prefilled = decode(asked, max_batch=4)
    assert prefilled == len(prompts[0]) + len(prompts[1])
    alone = [decode([one], max_batch=1)[0][0] for one in asked]
    assert shared == alone
    assert len({tuple(tokens) for tokens in shared[:2]}) == 2  # two choices of one prompt: two samples


def test_prompts_that_begin_alike_run_their_common_beginning_once(tiny):
    """Prompts of one environment share its system prompt, targets of one trajectory its history too: each
    common beginning runs once (a family within a family), and every row's greedy answer and first logits
    are those it gets when its whole prompt is prefilled alone."""

    import torch

    from pipeline.llm.batching import Sampling, Scheduler
    from pipeline.training.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(tiny))
    model = load_causal_lm(str(tiny)).eval()
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    system = encode("You simulate a Linux terminal of a web server. " * 6)
    history = encode("ls -la /var/log\nnginx access.log error.log syslog " * 4)
    prompts = [
        system + history + encode("cat error.log"),
        system + history + encode("tail -n 3 syslog | wc -l"),
        system + encode("whoami"),
        encode("a prompt of its own"),
        system + history,
    ]
    assert len(system) >= 32 and len(history) >= 32

    def decode(asked: list[list[int]], min_shared_prefix):
        scheduler = Scheduler(
            model, tokenizer, [tokenizer.eos_token_id], max_batch=len(asked), min_shared_prefix=min_shared_prefix
        )
        first = {}
        sampling = Sampling(max_tokens=6, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=3)
        rows = _decoded(scheduler, [(prompt, 0) for prompt in asked], sampling)
        for i, row in enumerate(rows):
            first[i] = torch.tensor([logprob for _, logprob in row.logprobs[0].top])
        return [row.generated for row in rows], first, scheduler.prefilled_tokens

    shared, shared_first, prefilled = decode(prompts, 32)
    # The system prompt once, then the history once but for its last token (the prompt that ends with the
    # history keeps it as its own), then what each prompt has of its own.
    own = [
        len(prompts[0]) - len(system) - len(history) + 1,
        len(prompts[1]) - len(system) - len(history) + 1,
        len(prompts[2]) - len(system),
        len(prompts[3]),
        1,
    ]
    assert prefilled == len(system) + len(history) - 1 + sum(own)
    assert prefilled < sum(map(len, prompts))
    for i, prompt in enumerate(prompts):
        tokens, first, alone = decode([prompt], None)
        assert alone == len(prompt)
        assert tokens[0] == shared[i]
        assert torch.allclose(first[0], shared_first[i], atol=1e-4)


@pytest.mark.parametrize(
    ("prompts", "done", "least", "families"),
    [
        ([(1, 2, 3, 4), (1, 2, 3, 5), (9, 9)], 0, 3, [[(1, 2, 3, 4), (1, 2, 3, 5)], [(9, 9)]]),
        ([(1, 2, 3, 4), (1, 2, 3, 5), (9, 9)], 0, 4, [[(1, 2, 3, 4)], [(1, 2, 3, 5)], [(9, 9)]]),
        ([(1, 2, 4), (1, 2, 3, 5), (1, 2, 3, 4)], 2, 1, [[(1, 2, 3, 4), (1, 2, 3, 5)], [(1, 2, 4)]]),
        ([(1, 2, 4), (1, 2, 3, 5), (1, 2, 3, 4)], 2, 2, [[(1, 2, 3, 4)], [(1, 2, 3, 5)], [(1, 2, 4)]]),
        ([(1, 2), (1, 2, 3), (2, 9)], 0, 1, [[(1, 2), (1, 2, 3)], [(2, 9)]]),
        ([(1, 2), (1, 2, 3)], 0, 2, [[(1, 2)], [(1, 2, 3)]]),  # (1, 2) keeps a token of its own: 1 to share
    ],
)
def test_prompt_families_share_at_least_the_minimum_beyond_what_is_shared(prompts, done, least, families):
    from pipeline.llm.batching import common_prefix_length, prefix_families

    assert prefix_families(prompts, done, least) == families
    assert prefix_families(prompts, done, None) == [[prompt] for prompt in sorted(prompts)]
    assert common_prefix_length([(1, 2, 3, 4), (1, 2, 3, 5), (1, 2, 7)]) == 2
    assert common_prefix_length([(1, 2, 3), (1, 2, 3, 4)]) == 2


def test_a_cancelled_request_leaves_the_batch_and_the_connection_closes(tiny):
    """ctrl-C (the client's task cancelled) while rows decode: they are cancelled in the scheduler, so
    closing the connection does not wait for answers nobody will read."""
    import asyncio

    import torch

    from pipeline.llm.transformers_backend import TransformersBackend

    backend = TransformersBackend(
        EndpointConfig(
            backend="transformers",
            model=str(tiny),
            max_tokens=1000,
            device="cpu",
            temperature=0,
            batch_size=4,
            stop_on_repetition=None,
        )
    )
    model, tokenizer, _ = backend._load()
    head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    head.bias.data[tokenizer.convert_tokens_to_ids("a")] = 10.0  # never an end token: each row would run 1,000 tokens
    model.lm_head = head

    async def ask_then_cancel() -> None:
        async with backend.connect() as send:
            answering = asyncio.ensure_future(send(requests()[:4]))
            await asyncio.sleep(0.3)
            answering.cancel()
            with pytest.raises(asyncio.CancelledError):
                await answering

    asyncio.run(ask_then_cancel())
    assert backend.scheduler.cancelled == 4


def test_int8_weights_answer_every_request_under_keys_of_their_own(tiny, tmp_path):
    """`quantize: int8` decodes with int8 linear layers: every request answered, cached apart from the float
    model's answers (they differ), and the generator's label differs too, so SFT never mixes the two."""
    import torch

    from pipeline.config.sft import GeneratorConfig
    from pipeline.llm.cache import sampling_parameters
    from pipeline.sft.generators import generator_label

    quantized, client = answers(tiny, tmp_path, "int8", temperature=0, batch_size=5, quantize="int8")
    assert all(a.text is not None and a.error is None and 1 <= a.completion_tokens <= 12 for a in quantized)
    model = client.backend._loaded[0]
    assert not any(type(m) is torch.nn.Linear for m in model.modules())  # every linear layer is quantized
    float_config = EndpointConfig(backend="transformers", model=str(tiny), device="cpu")
    int8_config = float_config.model_copy(update={"quantize": "int8"})
    assert sampling_parameters(int8_config) != sampling_parameters(float_config)
    assert "quantize" not in sampling_parameters(float_config)  # float answers keep the keys they had
    labels = {
        generator_label(GeneratorConfig(samples=2, endpoint=e), "base", "pools") for e in (float_config, int8_config)
    }
    assert len(labels) == 2


def test_rows_wait_while_the_batch_would_pass_the_kv_cache_budget(tiny):
    """A budget of three rows' cache: of eight long rows at most three decode together, each with the answer it
    gets with no budget; a row wider than the whole budget still runs, alone. Without a budget a benchmark's long
    histories padded every row of the batch to the longest (19 tau-bench rows, 13 GB)."""

    from pipeline.llm.batching import Sampling, Scheduler, default_kv_cache_gib, kv_bytes_per_token
    from pipeline.training.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(tiny))
    model = load_causal_lm(str(tiny)).eval()
    config = model.config
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 4
    assert kv_bytes_per_token(model) == per_token
    prompts = [tokenizer.encode(f"cat notes-{i}.txt | grep -c error", add_special_tokens=False) for i in range(8)]
    extent = max(map(len, prompts)) + 6

    def decode(asked: list[list[int]], kv_cache_gib: float | None):
        scheduler = Scheduler(model, tokenizer, [tokenizer.eos_token_id], max_batch=8, kv_cache_gib=kv_cache_gib)
        rows = _decoded(
            scheduler, [(prompt, 0) for prompt in asked], Sampling(max_tokens=6, temperature=0.0, ignore_eos=True)
        )
        return [row.generated for row in rows], scheduler.largest_batch

    unbounded, largest = decode(prompts, kv_cache_gib=1000.0)
    assert largest == 8
    budgeted, largest = decode(prompts, kv_cache_gib=(3 * extent + 0.5) * per_token / (1 << 30))
    assert largest == 3 and budgeted == unbounded
    alone, largest = decode(prompts[:2], kv_cache_gib=extent * per_token / 2 / (1 << 30))
    assert largest == 1 and alone == unbounded[:2]
    assert default_kv_cache_gib("cuda") is None and 0 < default_kv_cache_gib("cpu") < 1 << 20
    from types import SimpleNamespace

    assert kv_bytes_per_token(SimpleNamespace(config=SimpleNamespace(), dtype=model.dtype)) is None  # no budget


def test_a_temperature_too_small_to_divide_by_samples_greedily_and_fails_no_row_beside_it(tiny):
    """1e-40 passes the protocol's 0-2 check, but logits divided by it overflow float32: the NaN probabilities
    failed every row in the batch, another client's among them. Below 1e-5 a row is greedy, as vLLM's are."""
    import threading

    from pipeline.llm.batching import Row, Sampling, Scheduler
    from pipeline.training.models import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(str(tiny))
    model = load_causal_lm(str(tiny)).eval()
    prompt = tokenizer.encode("cat notes.txt", add_special_tokens=False)
    ended: list = []
    done = threading.Event()

    def listener(step) -> None:
        if step.finish_reason is not None:
            ended.append(step)
            if len(ended) == 3:
                done.set()

    tiny_temperature, warm, greedy = (
        Sampling(max_tokens=8, temperature=temperature, seed=1, ignore_eos=True) for temperature in (1e-40, 0.7, 0.0)
    )
    rows = [
        Row(prompt, tiny_temperature, 0, listener),
        Row(prompt, warm, 0, listener),
        Row(prompt, greedy, 0, listener),
    ]
    scheduler = Scheduler(model, tokenizer, [tokenizer.eos_token_id], max_batch=3)
    scheduler.submit(rows)
    assert done.wait(60)
    scheduler.close()
    assert [step.finish_reason for step in ended] == ["length"] * 3, ended
    assert rows[0].generated == rows[2].generated and len(rows[1].generated) == 8
