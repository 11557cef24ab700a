"""The torch device a local model answers on: `auto`, or a device torch names, checked before a model loads.

`simulacra serve --device cuda` on a machine whose torch has no CUDA ended in torch's "Torch not compiled with
CUDA enabled" traceback once the weights were read, and `--device tpu` in torch's list of device types (found by
probing, 2026-12-06). Here each is one line naming the setting and what this machine has.
"""

from pipeline.errors import UserFixableError

EXAMPLES = "auto (a CUDA GPU when there is one, else the CPU), cpu, cuda, cuda:1, mps"


def resolve_device(choice: str, setting: str) -> str:
    """`auto` -> `cuda` where torch sees a CUDA GPU, else `cpu`; any other choice as given, once torch parses it and
    this machine has it. `setting` names where the choice came from (`--device`, `evaluate.predictor.device`)."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(choice)
    except (RuntimeError, ValueError):
        raise UserFixableError(f"{setting} is `{choice}`: not a device torch names; use one of {EXAMPLES}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "a CPU build of torch" if torch.version.cuda is None else "no CUDA GPU or driver visible"
            raise UserFixableError(
                f"{setting} is `{choice}`: this machine has no CUDA GPU torch can use ({build}): use auto or cpu"
            )
        if device.index is not None and device.index >= count:
            raise UserFixableError(
                f"{setting} is `{choice}`: this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
            )
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserFixableError(f"{setting} is `{choice}`: torch has no MPS (Apple GPU) here: use auto or cpu")
    return choice
