"""bench/gpu_train.py, the GPU check's benchmark, runs end to end on CPU with the tiny model (its CI smoke test)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_training_benchmark_runs_the_stage_path_on_the_demo_store(tmp_path):
    command = [
        sys.executable,
        str(REPO / "bench" / "gpu_train.py"),
        "--shape",
        "tiny",
        "--steps",
        "3",
        "--warmup-steps",
        "1",
        "--max-length",
        "256",
        "--micro-batch-rows",
        "2",
        "--compare-padded",
        "--workspace",
        str(tmp_path),
    ]
    done = subprocess.run(
        command, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The CPU's training path (each packed sequence attended on its own), checked against SDPA's masked row too.
    packed = re.search(
        r"packed \(simulacra_segments, chunked loss, 512 tokens/step\): ([\d,]+) non-padding tokens/s", done.stdout
    )
    assert packed and int(packed.group(1).replace(",", "")) > 0, done.stdout
    for attention in ("simulacra_segments", "sdpa"):
        assert re.search(rf"packing check \({attention}, chunked, 6 sequences in \d rows\): .*: ok", done.stdout), (
            done.stdout
        )
    assert re.search(r"packed / padded: [\d.]+x", done.stdout), done.stdout
