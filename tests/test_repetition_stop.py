"""The loop stop of local generation (pipeline/llm/repetition.py): which token tails count as a loop, and
a looping row of the tiny model ended early while its batch mates and the cache behave as before."""

import random

import pytest

from pipeline.config.llm import EndpointConfig
from pipeline.config.model import TinyModelConfig
from pipeline.llm.cache import sampling_parameters
from pipeline.llm.client import ChatRequest, open_client
from pipeline.llm.repetition import repeating
from pipeline.store.database import Store
from pipeline.training.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    rng = random.Random(0)
    words = "ls cat grep total root file not found error permission denied json value true false".split()
    corpus = tmp_path_factory.mktemp("corpus") / "text.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(20)) for _ in range(2000)), encoding="utf-8")
    return build_tiny_model(TinyModelConfig(), [corpus], tmp_path_factory.mktemp("models") / "tiny")


CASES = [
    # (why, tokens, window, looping)
    ("one token sixteen times", [9] * 16, 8, True),
    ("a three-token unit repeated past the window", [1, 2, 3] * 6, 12, True),
    ("the unit is longer than a quarter of the window", list(range(5)) * 4, 16, False),
    ("too short to tell", [7] * 8, 8, False),
    ("a loop that began only in the last half of the window", [1, 2, 3, 4, 5, 6, 7, 8] + [0] * 8, 12, False),
    ("counting up never repeats", list(range(40)), 16, False),
    ("a listing whose lines share a prefix but differ", [5, 6, 1, 5, 6, 2, 5, 6, 3, 5, 6, 4, 5, 6, 8], 12, False),
]


@pytest.mark.parametrize(("why", "tokens", "window", "looping"), CASES, ids=[c[0] for c in CASES])
def test_repeating(why, tokens, window, looping):
    assert repeating(tokens, window) is looping


def test_the_loop_stop_is_part_of_the_cache_key_only_where_it_applies():
    local = EndpointConfig(backend="transformers", model="m")
    assert sampling_parameters(local)["stop_on_repetition"] == 64
    assert "stop_on_repetition" not in sampling_parameters(local.model_copy(update={"stop_on_repetition": None}))
    assert "stop_on_repetition" not in sampling_parameters(EndpointConfig(backend="openai", model="m"))


def test_a_looping_row_ends_early_and_keeps_what_it_wrote(tiny_model_dir, tmp_path):
    """The untrained tiny model, greedy, falls into a loop; with the stop on, its rows end long before
    max_tokens, each ending in a loop of the window's length; without it they run to max_tokens."""
    prompts = ["ls", "cat notes.txt and grep error", "true"]
    results = {}
    for stop in (None, 16):
        config = EndpointConfig(
            backend="transformers",
            model=str(tiny_model_dir),
            max_tokens=160,
            device="cpu",
            temperature=0.0,
            batch_size=3,
            stop_on_repetition=stop,
        )
        with Store(tmp_path / f"{stop}.duckdb") as store:
            client = open_client(config, store, "generator")
            results[stop] = client.complete_sync([ChatRequest(({"role": "user", "content": p},)) for p in prompts])
    unbounded, stopped = results[None], results[16]
    assert all(a.error is None for a in unbounded + stopped)
    looping = [i for i, a in enumerate(unbounded) if a.completion_tokens == 160]
    assert looping, "the tiny model no longer loops: pick prompts that do"
    for i in looping:
        assert stopped[i].completion_tokens < 160
        # The stopped answer is the unbounded one cut short: nothing else changed.
        assert unbounded[i].text.startswith(stopped[i].text)
    for i in set(range(len(prompts))) - set(looping):
        assert stopped[i].text == unbounded[i].text
