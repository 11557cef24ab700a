"""The fault hook (`orchestration.fail_stage`, `fail_how`): fires once per workspace at the stage's chosen point,
as an error the run records or as a SIGKILL of the process; never for another stage."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import ConfigError, load_config, parse_override
from pipeline.orchestration.faults import InjectedFault, maybe_fail

REPO = Path(__file__).resolve().parents[1]

KILL = """
import sys
from pipeline.config import load_config, parse_override
from pipeline.orchestration.faults import maybe_fail
config = load_config(None, [parse_override(text) for text in sys.argv[1:]])
maybe_fail(config, "sft", "after the first batch")
print("survived", flush=True)
"""


def _overrides(workspace: Path, how: str) -> list[str]:
    return [f"workspace.path={workspace}", "orchestration.fail_stage=sft", f"orchestration.fail_how={how}"]


def test_raise_fires_once_per_workspace_and_only_for_its_stage(tmp_path):
    config = load_config(None, [parse_override(text) for text in _overrides(tmp_path, "raise")])
    maybe_fail(config, "cpt", "after a checkpoint")  # another stage: nothing
    with pytest.raises(InjectedFault, match="'sft' after the first batch"):
        maybe_fail(config, "sft", "after the first batch")
    maybe_fail(config, "sft", "after the first batch")  # the retry goes through
    assert (tmp_path / "faults" / "sft.fired").read_text() == "after the first batch"


def test_kill_is_a_sigkill_of_the_process_once_per_workspace(tmp_path):
    def run() -> subprocess.CompletedProcess:
        args = [sys.executable, "-c", KILL, *_overrides(tmp_path, "kill")]
        return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120)

    killed = run()
    assert killed.returncode == -signal.SIGKILL and "survived" not in killed.stdout, killed.stderr
    assert (tmp_path / "faults" / "sft.fired").exists()
    again = run()
    assert again.returncode == 0 and "survived" in again.stdout, again.stderr


def test_an_unknown_way_to_fail_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="fail_how"):
        load_config(None, [parse_override("orchestration.fail_how=explode")])
