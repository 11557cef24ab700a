"""`simulacra serve --engine vllm`: the exported folder on vLLM, the engine GPU users serve with
(issue 19, deliver 1). vLLM comes with the `gpu` extra (`pip install -e .[gpu]`); it is not installed
on CPU machines, where the embedded server (pipeline/serving/server.py) serves the same protocol.

The command carries what the export recorded, so vLLM serves the model as it was trained:
- `--served-model-name` the export's model name, the id clients and the environment classes use;
- `--max-model-len` the length the model was trained at (simulacra.json), not the architecture's;
- `--generation-config` the folder's, whose end tokens include `<|im_end|>`, where observations end;
- for a thinking model `--reasoning-parser qwen3`: the thinking goes to `reasoning_content`, as here
  (`<think>...</think>` then the observation, Qwen3's layout). vLLM's parser finds `<think>` and
  `</think>` as single tokens of the vocabulary and refuses to run without them
  (vllm/reasoning/basic_parsers.py, "could not locate think start/end tokens"): Qwen3's tokenizer has
  them, the tiny offline one and Llama-family ones (SmolLM2) do not. Without them no parser is passed,
  the thinking stays in `content` (as `include_thinking` gives here) and the environment classes split
  it off themselves (pipeline/serving/thinking.py);
- the chat template is the tokenizer's (the exported one), so nothing needs passing for it; vLLM hands
  it a request's `chat_template_kwargs`, so `enable_thinking` chooses the answer format as here, and a
  format the model was not trained in fails in the template (`raise_exception`, a 400 of vLLM's) with
  the message `simulacra serve` gives. The reasoning parser goes with the trained format: a direct
  model gets none, and its whole answer is `content`.
Extra arguments after `--` go to vLLM unchanged (`--tensor-parallel-size 2`, `--gpu-memory-utilization`).

One difference remains: vLLM tokenises the rendered template as one string, so a literal `<|im_end|>`
inside an action becomes the special token there (pipeline/serving/chatml.py avoids it here).
"""

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.serving.export_folder import read_metadata


class VLLMMissing(UserFixableError):
    """`vllm` is not on PATH."""


def has_thinking_tokens(model_dir: Path) -> bool:
    """Whether the exported tokenizer holds `<think>` and `</think>` as tokens of their own, which
    vLLM's qwen3 reasoning parser looks up in the vocabulary (added tokens included)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():  # no fast tokenizer: nothing says the tokens are there
        return False
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    vocab = tokenizer["model"].get("vocab") or {}
    pieces = set(vocab) if isinstance(vocab, dict) else {entry[0] for entry in vocab}  # BPE: a dict; Unigram: pairs
    pieces |= {token["content"] for token in tokenizer.get("added_tokens", [])}
    return {"<think>", "</think>"} <= pieces


def vllm_command(model_dir: Path, host: str, port: int, extra: Sequence[str] = ()) -> list[str]:
    metadata = read_metadata(model_dir)
    command = [
        "vllm",
        "serve",
        str(model_dir),
        "--served-model-name",
        metadata["model_name"],
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(metadata["context_length"]),
        "--generation-config",
        str(model_dir),
    ]
    if metadata["thinking"] and has_thinking_tokens(model_dir):
        command += ["--reasoning-parser", "qwen3"]
    return command + list(extra)


def run_vllm(model_dir: Path, host: str, port: int, extra: Sequence[str] = ()) -> int:
    import subprocess

    if shutil.which("vllm") is None:
        raise VLLMMissing(
            "vLLM is not installed: `pip install -e .[gpu]` on a GPU machine, or serve with "
            "the embedded engine (`--engine embedded`)"
        )
    return subprocess.call(vllm_command(model_dir, host, port, extra))
