"""Shared fixtures: a config whose workspace lives in tmp_path, the public trajectories, and a tiny random
chat model (built offline, once per session)."""

import os
import random
from pathlib import Path

import pytest

# Under pytest-xdist two workers share the 2 cores: each torch (and each process a test starts, which inherits
# this) computes on one thread instead of two, so the workers do not oversubscribe the cores.
if os.environ.get("PYTEST_XDIST_WORKER") is not None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline.config import SimulacraConfig, load_config
from pipeline.store.database import Store

REPO = Path(__file__).resolve().parents[1]
PUBLIC_DATA = REPO.parent / "shared" / "data" / "public"


@pytest.fixture
def public_data() -> Path:
    if not PUBLIC_DATA.is_dir():
        pytest.skip(f"public trajectories not found at {PUBLIC_DATA} (the shared/ folder beside the repo)")
    return PUBLIC_DATA


@pytest.fixture
def config(tmp_path: Path) -> SimulacraConfig:
    return load_config(None, [{"workspace": {"path": str(tmp_path / "workspace")}}])


@pytest.fixture
def store(config: SimulacraConfig):
    with Store(config.workspace.database_path) as opened:
        yield opened


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A tiny random Qwen3-shaped model with a ChatML template, its tokenizer trained on shell-like words:
    for tests of decoding and caching, where what the model says does not matter."""
    from pipeline.config.model import TinyModelConfig
    from pipeline.training.tiny_model import build_tiny_model

    rng = random.Random(3)
    words = "ls cat grep notes total root file error json value true false".split()
    corpus = tmp_path_factory.mktemp("corpus") / "text.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(16)) for _ in range(500)), encoding="utf-8")
    return build_tiny_model(TinyModelConfig(), [corpus], tmp_path_factory.mktemp("models") / "tiny-chat")


# `make test` runs the suite on 2 pytest-xdist workers, one module to a worker at a time (`--dist loadscope`:
# a module's module-scoped server or model is built once). Modules are handed out in collection order
# (`--no-loadscope-reorder`), so the longest go first and the short ones fill in beside them; xdist's own order
# (most tests first) left the few-test, long modules (SFT, CPT, the Prefect server) to the end, on one worker
# for minutes. Seconds: each scope's sum in one run of the suite (2026-12-05, the Zen 1 host, `pytest --junitxml`
# with no .pyc written, so modules that start subprocesses weigh a little more than under `make test`; before the
# openenv refusals stopped importing OpenEnv's server, about 50 s off the sandbox scope). The sandbox scope's
# modules (SANDBOX_MODULES, below) run as one, placed where the first of them is listed. Handed out greedily in this
# order, that run's module times make a 976 s schedule on 2 workers, 4 s over half their sum; in the order before
# (the 2026-12-02 list), 997 s (a simulation of the scheduler on those times, not a timing).
LONGEST_FIRST = [
    "test_prefect_server.py",  # 304
    "test_openenv.py",  # the sandbox scope: 306 (test_openenv 127, test_serve 81, test_rl_stage 54, ...)
    "test_sft_stage.py",  # 230
    "test_real_model.py",  # 179
    "test_cpt_stage.py",  # 137
    "test_fidelity_stage.py",  # 99
    "test_flows.py",  # 80
    "test_evaluate_stage.py",  # 62
    "test_vector_env.py",  # 56
    "test_gpu_train_bench.py",  # 52
    "test_llm_secret_block.py",  # 45
]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# Modules whose tests start rule-reward sandboxes, and the two that assert over every sandbox uid on the
# machine (none left behind; exactly two sandboxes' uids at once): one scope, so one worker runs them one after
# the other and no sandbox of the other worker is counted.
SANDBOX_MODULES = {
    "test_sandbox.py",
    "test_sandbox_attacks.py",
    "test_demo_verifiers.py",
    "test_rl_rewards.py",
    "test_rl_stage.py",
    "test_rl_prompts.py",
    "test_serve.py",
    "test_openenv.py",
    "test_workspace_privacy.py",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "sandbox" if Path(module).name in SANDBOX_MODULES else module

    return Scheduling(config, log)
