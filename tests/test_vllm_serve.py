"""`simulacra serve FOLDER --engine vllm` run for real (issue 19, item 1): where vLLM and a CUDA GPU are
(`deploy/gpu-check.sh` runs this file), skipped elsewhere. tests/test_serve.py tests the command it builds.

The tiny offline model, taught the model card's example request (its answer a thinking block, then the
observation), exported in the thinking (sft) format, is served by vLLM and, as the reference, by the
embedded engine on CPU (`simulacra serve FOLDER --device cpu`), both over 127.0.0.1 with the `openai` client:
- the card's example request, greedy, gets the same text from both (and the same prompt length);
- streamed, vLLM's chunks add up to its whole answer;
- `n=2` with a seed gives two choices, and the seed reproduces them;
- a stop string cuts the answer where the embedded engine cuts it;
- the prompt vLLM renders from the card's request (its `/tokenize` endpoint) is, token for token, the
  prompt of the SFT sample of the same query (tests/test_export.py's check of the card, on vLLM).

Two facts of vLLM shape the fixture. Its attention backends (FlashAttention, Triton, FlexAttention:
`get_supported_head_sizes`) take head sizes 32, 64, ..., 256, not the tiny model's 16 (64 wide, 4 heads),
so the model is built with one head of 64: the default's weight shapes. And vLLM's qwen3 reasoning parser
needs `<think>`/`</think>` as single tokens, which the tiny tokenizer lacks, so `vllm_command` passes no
parser for it (pipeline/serving/vllm_engine.py): the thinking stays in `content`, what the embedded
engine answers with `include_thinking`. The taught answer is greedy in float32, bfloat16 and float16 alike
(the top logit leads by 3.7 or more at every step), so vLLM's half precision does not change it.
"""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[gpu]' on a GPU machine)")
import torch

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU, which vLLM serves on", allow_module_level=True)

import httpx

from pipeline.config.model import TinyModelConfig
from pipeline.serving.export_folder import write_export
from pipeline.serving.model_card import EXAMPLE_DOMAIN, EXAMPLE_SYSTEM, example_request
from pipeline.serving.prompt_formats import prompt_format
from pipeline.serving.thinking import split_thinking
from pipeline.store.schema import SystemPrompt
from pipeline.training.tiny_model import build_tiny_model
from tests.served_world_model import THINKING_ANSWER, teach

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
MODEL = "world-model-test"
REQUEST = example_request(prompt_format("sft"), MODEL, max_tokens=40)  # the card's; greedy (temperature 0)
STARTUP_SECONDS = 420  # vLLM imports, loads and profiles; eager mode skips compilation and CUDA graphs


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    shape = TinyModelConfig(max_position_embeddings=512, num_heads=1)  # head size 64 (docstring)
    model = build_tiny_model(shape, [REPO / "data/demo/terminal.jsonl"], root / "tiny")
    teach(model, REQUEST["messages"], THINKING_ANSWER)
    return write_export(
        model,
        root / "export",
        prompt_format("sft"),
        {"model_name": MODEL, "fingerprint": "test", "context_length": 512, "max_history_chars": 24_000},
        "# card\n",
    )


def free_port() -> int:
    """A port free now, for vLLM's server (whose own `--port 0` this test does not rely on)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serving(arguments: list[str], log: Path) -> Iterator[str]:
    """`simulacra serve ARGUMENTS` in its own process group (vLLM starts an engine process of its own),
    its output in `log`; yields the /v1 base URL once /v1/models answers, and stops the group after."""
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # where `vllm` was installed with this interpreter
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipeline.cli", "serve", *arguments, "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            try:
                httpx.get(f"{base_url}/models", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"simulacra serve {' '.join(arguments)} did not start; its output ends:\n"
                        + log.read_text(errors="replace")[-4000:]
                    )
                time.sleep(1)
        yield base_url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.fixture(scope="module")
def vllm_server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "vllm.log"
    with serving(
        [str(folder), "--engine", "vllm", "--", "--enforce-eager", "--gpu-memory-utilization", "0.2"], log
    ) as base_url:
        yield base_url


@pytest.fixture(scope="module")
def cpu_server(folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("logs") / "embedded.log"
    with serving([str(folder), "--device", "cpu"], log) as base_url:
        yield base_url


def _client(base_url: str):
    from openai import OpenAI

    return OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def vllm_client(vllm_server):
    return _client(vllm_server)


@pytest.fixture(scope="module")
def cpu_client(cpu_server):
    return _client(cpu_server)


def test_the_cards_request_gets_the_cpu_servers_greedy_answer(vllm_client, cpu_client):
    served = vllm_client.chat.completions.create(**REQUEST)
    raw = cpu_client.chat.completions.create(**REQUEST, extra_body={"include_thinking": True})
    split = cpu_client.chat.completions.create(**REQUEST)
    assert served.choices[0].message.content == raw.choices[0].message.content == THINKING_ANSWER
    assert split_thinking(served.choices[0].message.content) == (
        split.choices[0].message.model_extra["reasoning_content"],
        split.choices[0].message.content,
    )
    assert served.choices[0].finish_reason == raw.choices[0].finish_reason == "stop"  # at <|im_end|>
    assert served.usage.prompt_tokens == raw.usage.prompt_tokens
    assert served.usage.completion_tokens == raw.usage.completion_tokens


def test_streamed_chunks_add_up_to_the_whole_answer(vllm_client):
    whole = vllm_client.chat.completions.create(**REQUEST).choices[0].message.content
    chunks = list(vllm_client.chat.completions.create(**REQUEST, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_n_choices_of_a_seeded_request(vllm_client):
    sampled = dict(REQUEST, temperature=1.0, max_tokens=16, n=2, seed=11, extra_body={"ignore_eos": True})
    first = vllm_client.chat.completions.create(**sampled)
    assert [c.index for c in first.choices] == [0, 1]
    assert first.usage.completion_tokens == 2 * 16
    again = vllm_client.chat.completions.create(**sampled)
    assert [c.message.content for c in again.choices] == [c.message.content for c in first.choices]


def test_a_stop_string_cuts_where_the_cpu_server_cuts(vllm_client, cpu_client):
    stopped = dict(REQUEST, stop=["never-there", "notes"])
    served = vllm_client.chat.completions.create(**stopped).choices[0]
    reference = cpu_client.chat.completions.create(**stopped, extra_body={"include_thinking": True}).choices[0]
    assert (served.message.content, served.finish_reason) == (THINKING_ANSWER[: THINKING_ANSWER.find("notes")], "stop")
    assert (served.message.content, served.finish_reason) == (reference.message.content, reference.finish_reason)


def test_vllm_renders_the_training_prompt_token_for_token(vllm_server, cpu_client, folder):
    from transformers import AutoTokenizer

    from pipeline.prompts.sft import TEMPLATES
    from pipeline.sft.samples import sft_sequence
    from pipeline.store.schema import ScoredTurn
    from pipeline.training.sequences import SequenceBuilder

    response = httpx.post(
        vllm_server.removesuffix("/v1") + "/tokenize",
        json={"model": MODEL, "messages": REQUEST["messages"], "add_generation_prompt": True},
    )
    response.raise_for_status()
    rendered = response.json()["tokens"]
    turns = [m["content"] for m in REQUEST["messages"] if m["role"] in ("user", "assistant")]
    history = [ScoredTurn(i, a, o, "history", 1.0) for i, (a, o) in enumerate(zip(turns[:-1:2], turns[1::2]))]
    builder = SequenceBuilder(AutoTokenizer.from_pretrained(folder), 1 << 20, 0)
    sample = sft_sequence(
        builder,
        "card",
        TEMPLATES[0].render(EXAMPLE_DOMAIN, SystemPrompt(**EXAMPLE_SYSTEM)),
        history,
        turns[-1],
        THINKING_ANSWER,
        len(history),
    )
    labelled = next(i for i, label in enumerate(sample.sequence.labels) if label != -100)
    assert rendered == sample.sequence.input_ids[:labelled]
    assert len(rendered) == cpu_client.chat.completions.create(**REQUEST).usage.prompt_tokens
