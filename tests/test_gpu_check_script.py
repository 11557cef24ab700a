"""deploy/gpu-check.sh's control flow, on any machine: `PYTHON` is a stand-in that answers the script's
probes (CUDA, vLLM, pytest) and plays the training and serving checks with the exit statuses a case gives,
so what runs, what is said and the exit status are checked without a GPU (the checks themselves run on
one: bench/gpu_train.py, tests/test_vllm_serve.py)."""

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Probes exit 0 when the thing is there; `bench/gpu_train.py ...` and `-m pytest ...` print what ran.
STAND_IN = """#!/usr/bin/env bash
case "$1 $2" in
    "-c import torch"*) exit "$CUDA" ;;
    "-c import vllm") exit "$VLLM" ;;
    "-c import pytest") exit "$PYTEST" ;;
    "-c "*) exit 1 ;;
    "bench/gpu_train.py "*) echo "ran training $*"; exit "$TRAIN" ;;
    "-m pytest") echo "ran serving $*"; exit "$SERVING" ;;
esac
echo "unexpected: $*" >&2
exit 99
"""


@pytest.mark.parametrize(
    "case, status, ran, said",
    [
        (dict(CUDA=1), 1, [], "torch sees no CUDA GPU"),
        (
            dict(VLLM=1),
            0,
            ["training"],
            "vLLM is not installed: the vLLM serving check was skipped (pip install -e '.[gpu]')",
        ),
        (dict(PYTEST=1), 0, ["training"], "pytest is not installed"),
        ({}, 0, ["training", "serving"], ""),
        (dict(TRAIN=1), 1, ["training", "serving"], ""),  # a training failure still runs the serving check
        (dict(TRAIN=2, SERVING=1), 2, ["training", "serving"], "the vLLM serving check failed"),
        (dict(SERVING=1), 1, ["training", "serving"], "the vLLM serving check failed"),
        (dict(TRAIN=1, VLLM=1), 1, ["training"], "vLLM is not installed"),
    ],
)
def test_both_checks_run_and_either_failure_fails_the_script(tmp_path, case, status, ran, said):
    python = tmp_path / "python"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    env = {
        **os.environ,
        "PYTHON": str(python),
        "CUDA": "0",
        "VLLM": "0",
        "PYTEST": "0",
        "TRAIN": "0",
        "SERVING": "0",
        **{key: str(value) for key, value in case.items()},
    }
    completed = subprocess.run(
        [str(REPO / "deploy/gpu-check.sh"), "--max-length", "4096"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert completed.returncode == status, completed.stderr
    assert [line.split()[1] for line in completed.stdout.splitlines()] == ran
    if "training" in ran:  # the script's arguments reach the training check, as before
        assert completed.stdout.splitlines()[0].endswith("--compare-padded --max-length 4096")
    if "serving" in ran:
        assert completed.stdout.splitlines()[1] == "ran serving -m pytest -q tests/test_vllm_serve.py"
    assert said in completed.stderr
    assert "unexpected" not in completed.stderr
