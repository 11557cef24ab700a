#!/usr/bin/env bash
# The GPU check (issue 9): train a randomly initialised Qwen3-0.6B-shaped model on the demo store with the
# training stages' own path, and print non-padding tokens/s, MFU and peak memory against the targets
# (one H200, max_length 2048: >= 80,000 tokens/s, <= 40 GiB), then the same against the padded batches
# the CPT stage used before, in the same run. No model hub, no Prefect, no network.
# Before training it checks packed rows (several to a micro-batch) against the sequences run one by one, in
# loss and gradients, under every attention path the loader can pick on this host: flash_attention_2 where
# flash-attn is installed, flex attention, SDPA. A mismatch makes the script exit 1 (after the timings).
# Then, where vLLM is installed, the serving check (tests/test_vllm_serve.py, issue 19): `simulacra serve
# --engine vllm` on an exported tiny model answers the model card's example request greedily with the
# text the embedded CPU server gives, streams the same text, returns n choices, honours stop strings, and
# renders the prompt token for token as training did. Without vLLM it says so in one line and skips it.
# Both run either way; the exit status is the training check's when it fails, else 1 when serving fails.
#
#   deploy/gpu-check.sh                              # from anywhere; extra arguments go to bench/gpu_train.py
#   deploy/gpu-check.sh --gradient-checkpointing --micro-batch-rows 16 --max-length 4096
#
# Needs the project installed with a CUDA build of torch and the `gpu` extra (liger-kernel, vllm), and the
# `test` extra (pytest) for the serving check; without liger-kernel the loss falls back to the chunked one,
# and the check says so.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
if ! "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu-check: torch sees no CUDA GPU (install a CUDA build of torch: README, Installing)" >&2
    exit 1
fi
if ! "$PYTHON" -c 'import liger_kernel' 2>/dev/null; then
    echo "gpu-check: liger-kernel is not installed (pip install -e '.[gpu]'): the loss runs chunked, slower" >&2
fi
if ! "$PYTHON" -c 'import flash_attn' 2>/dev/null; then
    echo "gpu-check: flash-attn is not installed: training uses flex attention, and flash_attention_2 goes unchecked" >&2
fi
status=0
# The training check's own exit status, as when this script exec'ed it; the serving check runs either way.
"$PYTHON" bench/gpu_train.py --workspace "${SIMULACRA_GPU_CHECK_WORKSPACE:-gpu-check-workspace}" --compare-padded "$@" \
    || status=$?
if ! "$PYTHON" -c 'import vllm' 2>/dev/null; then
    echo "gpu-check: vLLM is not installed: the vLLM serving check was skipped (pip install -e '.[gpu]')" >&2
elif ! "$PYTHON" -c 'import pytest' 2>/dev/null; then
    echo "gpu-check: pytest is not installed: the vLLM serving check was skipped (pip install -e '.[test]')" >&2
elif ! "$PYTHON" -m pytest -q tests/test_vllm_serve.py; then
    echo "gpu-check: the vLLM serving check failed (tests/test_vllm_serve.py)" >&2
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
