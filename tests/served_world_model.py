"""A world model served for real, shared by the tests of what is built on `simulacra serve` (tests/test_serve.py,
tests/test_vector_env.py, tests/test_vllm_serve.py): the tiny offline model taught one thinking answer, exported
in the thinking (sft) format, and `simulacra serve` of a folder in a subprocess on 127.0.0.1.

The taught query is a terminal episode's third step: after `TURNS`, the action `wc -l notes.txt` is answered
`THINKING_ANSWER` (a thinking block, then the observation "3 notes.txt"), so a test can make an episode end on a
real answer of the served model.
"""

from collections.abc import Iterator
from pathlib import Path

from pipeline.config.model import TinyModelConfig
from pipeline.serving.export_folder import write_export
from pipeline.serving.local_server import served_folder
from pipeline.serving.prompt_formats import prompt_format, world_model_messages
from pipeline.store.schema import SystemPrompt
from pipeline.training.tiny_model import build_tiny_model

REPO = Path(__file__).resolve().parents[1]
SYSTEM = SystemPrompt(
    task_description="Count the lines of notes.txt.",
    action_space="bash commands, one per action",
    initial_state="~/notes.txt holds three lines.",
)
TURNS = [("ls", "notes.txt"), ("cat notes.txt", "one\ntwo\nthree")]
SFT_FORMAT = prompt_format("sft")
THINKING_QUERY = world_model_messages(SFT_FORMAT, "terminal", SYSTEM, TURNS, "wc -l notes.txt")
THINKING_ANSWER = "<think>\nThree lines.\n</think>\n\n3 notes.txt"
MODEL_NAME = "world-model-test"


def teach(
    model_dir: Path,
    messages: list[dict[str, str]],
    answer: str,
    tokenizer=None,
    tools=None,
    fmt=SFT_FORMAT,
    more: tuple[tuple[list[dict[str, str]], str], ...] = (),
    steps: int = 60,
) -> None:
    """Overfit the tiny model on one query's answer (a thinking block, then an observation), so the
    served model really writes thinking and the server's separation of it is tested on a real output;
    `more` (query, answer) pairs are taught in the same steps."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipeline.serving.chat_template import chat_template

    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        tokenizer.chat_template = chat_template(fmt)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []
    for query, taught in ((messages, answer), *more):
        prompt = tokenizer(
            tokenizer.apply_chat_template(query, tools=tools, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        target = tokenizer(taught, add_special_tokens=False)["input_ids"] + [end]
        examples.append((torch.tensor([prompt + target]), torch.tensor([[-100] * len(prompt) + target])))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(0)
    for _ in range(steps):
        loss = sum(model(input_ids=ids, labels=labels).loss for ids, labels in examples)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(model_dir)


def taught_export(root: Path) -> Path:
    """The tiny model, taught the thinking answer, exported in the thinking (sft) format under `root`."""
    model = build_tiny_model(
        TinyModelConfig(max_position_embeddings=512), [REPO / "data/demo/terminal.jsonl"], root / "tiny"
    )
    teach(model, THINKING_QUERY, THINKING_ANSWER)
    return write_export(
        model,
        root / "export",
        prompt_format("sft"),
        {"model_name": MODEL_NAME, "fingerprint": "test", "context_length": 512, "max_history_chars": 24_000},
        "# card\n",
    )


def serve_folder(folder: Path) -> Iterator[str]:
    """`simulacra serve` of an exported folder in a subprocess (pipeline/serving/local_server.py): its /v1 URL,
    until the generator closes."""
    log = folder.with_name(f"{folder.name}-serve.log")
    with served_folder(folder, log=log, max_tokens=16, extra_options=("--max-body-mb", "0.25")) as server:
        yield server.base_url
