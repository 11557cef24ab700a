"""The fidelity stage end to end (issue 31): a real DuckDB workspace of the demo's terminal trajectories split into
pools, the tiny model registered as the cpt checkpoint and served by `simulacra serve` in a subprocess, the
retrieval baseline, the real household and bookstore engines, the offline similarity judge.

- A run killed with SIGKILL (by the fault hook, right after its first simulated episode is committed), then
  rerun: no stored step or episode is played or scored again (each keeps its row and timestamp), none is missing
  or doubled, and the killed run's server died with it. A third run finds everything stored: it serves nothing
  and plays nothing, and reports the same numbers.
- What the report holds: closed- and open-loop curves per domain with intervals, steps to the first divergence,
  each policy's success rates with intervals in the real environment and in each simulator, Kendall's tau; the
  simulated episodes are the real ones' actions (open-loop policies, played many at once through the vector
  environment); the bookstore's prompts pass the tiny model's context, which ends those episodes as such.
- The export that follows quotes the checkpoint's fidelity numbers in its model card; a card without a fidelity
  run says nothing of it.
- `SimulatorEnv`, the gymnasium environment the retrieval baseline plays in, on a scripted simulator.
- The command's one-line errors: no eval pool yet, no model, `--data` with nothing to roll out, a checkpoint that
  is no folder.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.config import load_config
from pipeline.environments.household_env import household_task
from pipeline.evaluation.scoring import Prediction
from pipeline.fidelity.episodes import run_episode
from pipeline.fidelity.policies import RandomPolicy, Solver
from pipeline.fidelity.simulated_episodes import CONTEXT_EXHAUSTED, SimulatorEnv
from pipeline.serving.model_card import CardFacts, collect_fidelity, render_card
from pipeline.store.database import Store
from stages import filter as filter_stage
from stages import ingest, split

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

FIDELITY = {
    "max_trajectories": 3,
    "max_steps": 2,
    "episodes_per_policy": 1,
    "environments": ["text-game", "mcp"],
    "max_tokens": 4,
    "episodes_together": 8,
}
SETTINGS = {
    "fidelity": FIDELITY,
    # Histories the tiny model's context of 1024 tokens holds, so no rollout step is refused for its length.
    "evaluate": {"max_history_chars": 400},
    "export": {"checkpoint": "cpt-test"},
}
SIMULATED = 10  # 5 policies x 1 task x 2 environments


def _config(root: Path):
    return load_config(root / "config.yaml")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tiny_chat_model) -> Path:
    """The demo's terminal trajectories through ingest, filter and split; the tiny model registered as the cpt
    checkpoint; the config file the stage and the command read."""
    root = tmp_path_factory.mktemp("fidelity")
    (root / "config.yaml").write_text(yaml.safe_dump({"workspace": {"path": str(root / "workspace")}, **SETTINGS}))
    config = _config(root)
    shutil.copytree(tiny_chat_model, root / "cpt-model")
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store, paths=[str(REPO / "data/demo/terminal.jsonl")])
        filter_stage.run(config, store)
        split.run(config, store)
        store.execute(
            "INSERT INTO checkpoints VALUES ('cpt-test', 'cpt', 'cpt-fingerprint', ?, 'tiny', now(), '{}')",
            [str(root / "cpt-model")],
        )
    return root


def _rows(config, table: str) -> dict[tuple, str]:
    """Every row's key -> its created_at, read-only (the killed run's lock is gone with it)."""
    keys = {
        "fidelity_steps": "inputs, simulator, trajectory_id, mode, step",
        "fidelity_episodes": "inputs, simulator, environment, policy, seed",
    }[table]
    with Store(config.workspace.database_path, read_only=True) as store:
        rows = store.execute(f"SELECT {keys}, created_at FROM {table}").fetchall()
    return {tuple(row[:-1]): str(row[-1]) for row in rows}


def _servers_of(workspace: Path) -> list[int]:
    """Processes serving a scratch copy of this workspace's models."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if " serve " in command and str(workspace / "runs" / "fidelity" / "served") in command:
            found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def runs(prepared):
    """The stage killed mid-way (a real process, SIGKILL), then rerun, then run once more: what each left.

    The kill is the fault hook's (`orchestration.fail_how: kill`): the process SIGKILLs itself right after the cpt
    checkpoint's first simulated episode is committed. A kill sent from here on seeing a progress line missed
    that moment whenever the tiny model played all ten episodes before the line was printed."""
    config = _config(prepared)
    log = prepared / "killed.log"
    command = [sys.executable, "-m", "pipeline.cli", "--config", str(prepared / "config.yaml")]
    faults = ["--set", "orchestration.fail_stage=fidelity", "--set", "orchestration.fail_how=kill"]
    with open(log, "w") as output:
        child = subprocess.Popen(
            [*command, *faults, "fidelity"],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        returncode = child.wait(timeout=600)
    finally:
        child.kill()
        child.wait()
    assert returncode == -signal.SIGKILL, f"the run was not killed (exit {returncode}):\n{log.read_text()[-3000:]}"
    deadline = time.monotonic() + 60  # the server is told SIGTERM when its parent dies, and stops
    while _servers_of(config.workspace.root) and time.monotonic() < deadline:
        time.sleep(0.5)
    orphans = _servers_of(config.workspace.root)
    killed = {table: _rows(config, table) for table in ("fidelity_steps", "fidelity_episodes")}

    from stages import fidelity

    with Store(config.workspace.database_path) as store:
        resumed = fidelity.run(config, store)
    after = {table: _rows(config, table) for table in ("fidelity_steps", "fidelity_episodes")}
    with Store(config.workspace.database_path) as store:
        again = fidelity.run(config, store)
        episodes = store.rows("SELECT * FROM fidelity_episodes ORDER BY simulator, environment, policy, seed")
        steps = store.rows("SELECT simulator, parse_status, prediction, score FROM fidelity_steps")
        headline = collect_fidelity(store, "cpt-test")
    final = {table: _rows(config, table) for table in ("fidelity_steps", "fidelity_episodes")}
    return {
        "orphans": orphans,
        "killed": killed,
        "after": after,
        "final": final,
        "resumed": resumed,
        "again": again,
        "episodes": episodes,
        "steps": steps,
        "headline": headline,
    }


def test_a_killed_run_resumes_without_repeating_a_stored_step_or_episode(runs):
    killed, after = runs["killed"], runs["after"]
    assert runs["orphans"] == [], "the killed run's simulacra serve outlived it"
    simulated = [key for key in killed["fidelity_episodes"] if key[1] != "real"]
    assert len(simulated) == 1, "the kill did not land right after the first simulated episode was committed"
    assert len([key for key in killed["fidelity_episodes"] if key[1] == "real"]) == SIMULATED
    assert killed["fidelity_steps"], "the rollouts were not stored before the episodes began"
    for table in ("fidelity_steps", "fidelity_episodes"):
        # Every row from before the kill is there, untouched: nothing was played or scored twice.
        assert {key: after[table][key] for key in killed[table]} == killed[table], table
    resumed = runs["resumed"].metrics
    assert resumed["real_episodes_played"] == 0
    # The cpt checkpoint's missing episodes, then the retrieval baseline's every one.
    assert resumed["simulated_episodes_played"] == SIMULATED - len(simulated) + SIMULATED
    by_simulator: dict[str, int] = {}
    for key in after["fidelity_episodes"]:
        by_simulator[key[1]] = by_simulator.get(key[1], 0) + 1
    assert sorted(by_simulator.values()) == [SIMULATED] * 3 and "real" in by_simulator


def test_a_finished_run_is_reported_again_without_serving_or_playing(runs):
    resumed, again = runs["resumed"], runs["again"]
    assert again.metrics["real_episodes_played"] == again.metrics["simulated_episodes_played"] == 0
    assert again.tables == resumed.tables and again.output_path == resumed.output_path
    assert again.summary.split(" (")[0] == resumed.summary.split(" (")[0]
    assert runs["final"] == runs["after"]  # not a row added or rewritten


def test_the_report_holds_the_curves_divergence_and_agreement(runs):
    result = runs["resumed"]
    report = json.loads((result.output_path / "report.json").read_text())
    models = {simulator["model"]: simulator for simulator in report["simulators"]}
    assert set(models) == {"cpt", "retrieval baseline"} and report["judge"] == "semantic"
    cpt = models["cpt"]
    modes = {(p["domain"], p["mode"], p["step"]) for p in cpt["curves"]}
    assert {("terminal", mode, 1) for mode in ("open", "closed")} <= modes and ("all", "closed", 2) in modes
    assert all(0 <= p["score"]["low"] <= p["score"]["mean"] <= p["score"]["high"] <= 100 for p in cpt["curves"])
    assert {m["mode"] for m in cpt["divergence"]} == {"open", "closed"}
    rates = cpt["agreement"]["rates"]
    assert {(r["environment"], r["policy"]) for r in rates} >= {("text-game", "solver"), ("all", "random")}
    solver = next(r for r in rates if (r["environment"], r["policy"]) == ("text-game", "solver"))
    assert solver["real"]["mean"] == 1.0 and solver["real"]["low"] < 1.0  # Wilson: one episode proves little
    assert {rank["environment"] for rank in cpt["agreement"]["kendall_tau_b"]} == {"text-game", "mcp", "all"}
    assert cpt["headline"]["environments"] == ["mcp", "text-game"] and cpt["headline"]["policies"] == 5
    for name in ("fidelity.txt", "agreement.txt", "fidelity-cpt.png", "fidelity-retrieval-baseline.png"):
        assert (result.output_path / name).stat().st_size > 0, name
    assert (
        "steps to first divergence, closed loop (Kaplan-Meier median)"
        in (result.output_path / "fidelity.txt").read_text()
    )
    assert set(result.tables) == {"fidelity-curves", "fidelity-divergence", "fidelity-agreement", "fidelity-ranks"}
    assert set(result.images) == {"fidelity-cpt", "fidelity-retrieval-baseline"}
    assert "cpt: median steps to first divergence" in result.summary and "Kendall tau-b" in result.summary


def test_a_prompt_the_server_refuses_for_its_length_is_the_simulators_answer(runs):
    """Some terminal prompts (the system prompt and 400 characters of history) pass the tiny model's 1024 tokens:
    `simulacra serve` refuses them, and the step is scored as the empty observation, not asked again."""
    served = [step for step in runs["steps"] if step["simulator"].startswith("cpt-test/")]
    refused = [step for step in served if step["parse_status"] == "context_exceeded"]
    assert refused and len(refused) < len(served)
    assert all(step["prediction"] is None and step["score"] is not None for step in refused)
    assert runs["resumed"].metrics["steps"] == len(served) // 2  # each step in both loops, none failed
    # The summary says so: a divergence that is the context's, not the model's answers.
    assert f"{len(refused)} of {len(served)} steps past the model's context (scored as empty answers" in (
        runs["resumed"].summary
    )


def test_simulated_episodes_take_the_real_episodes_actions(runs):
    """Open-loop policies: in the simulator an episode is the real one's actions, up to where one of them ended."""
    episodes = runs["episodes"]
    real = {
        (e["environment"], e["policy"], e["seed"]): json.loads(e["history"])
        for e in episodes
        if e["simulator"] == "real"
    }
    for episode in episodes:
        if episode["simulator"] == "real":
            continue
        played = [action for action, _ in json.loads(episode["history"])]
        there = [action for action, _ in real[(episode["environment"], episode["policy"], episode["seed"])]]
        shorter = min(len(played), len(there))
        assert played[:shorter] == there[:shorter], (episode["simulator"], episode["policy"])
        if episode["environment"] == "mcp" and episode["simulator"].startswith("cpt-test/"):
            # The bookstore's nine tools alone pass the tiny model's 1024 tokens: the server refuses the prompt.
            assert (episode["ending"], episode["steps"], episode["success"]) == (CONTEXT_EXHAUSTED, 0, False)
            assert episode["error"].startswith("ContextExhausted")
        else:
            assert episode["ending"] in ("success", "stopped", "truncated") and episode["error"] is None


def test_the_export_quotes_the_checkpoints_fidelity(runs, prepared):
    from stages import export

    headline = runs["headline"]
    assert headline is not None and headline["model"] == "cpt" and headline["trajectories"] == 3
    config = _config(prepared)
    with Store(config.workspace.database_path) as store:
        result = export.run(config, store)
    card = (result.output_path / "README.md").read_text()
    section = card[card.index("## Fidelity") :]
    assert f"{headline['trajectories']} held-out trajectories" in section
    assert "in closed loop, the model's own answers as its history" in section
    assert "Kendall's tau-b" in section and "(mcp, text-game)" in section


def _facts(fidelity) -> CardFacts:
    return CardFacts("wm", "cpt-1", "cpt", "cpt", False, 512, None, "apache-2.0", "project", {}, fidelity=fidelity)


HEADLINE = {
    "trajectories": 20,
    "threshold": 50.0,
    "median_closed": 3,
    "followed_closed": 10,
    "diverged_closed": 14,
    "median_open": None,
    "followed_open": 10,
    "step": 6,
    "closed": 41.5,
    "open": 58.25,
    "gap": {"mean": -16.75, "low": -24.0, "high": -9.5, "n": 12},
    "kendall_tau": 0.8,
    "tau_why": None,
    "policies": 5,
    "environments": ["terminal"],
    "model": "cpt",
    "judge": "semantic",
    "measured": "2026-12-02 18:00:00",
}


def test_the_card_quotes_fidelity_in_words_and_says_nothing_without_it():
    card = render_card(_facts(HEADLINE))
    assert "Measured by `simulacra fidelity` on 2026-12-02 (judge `semantic`, 20 held-out trajectories" in card
    assert "median: 3 in closed loop" in card
    assert "more than 10 (fewer than half diverged within the 10 steps followed) in open loop" in card
    assert "At step 6 (the last step half the trajectories reach): closed loop 41.5, open loop 58.2" in card
    assert "closed - open -16.8 [-24.0, -9.5]" in card and "Kendall's tau-b +0.80 between" in card
    assert "## Fidelity" not in render_card(_facts(None))


class Scripted:
    """A simulator answering every action with its number in the episode; None at step `fails` fails it."""

    name = "scripted"

    def __init__(self, fails: int | None = None):
        self.fails = fails
        self.requests = []

    def observations(self, requests):
        self.requests += requests
        (request,) = requests
        if len(request.history) + 1 == self.fails:
            return [Prediction("generation_failed", None, None, "HTTP 500")]
        return [Prediction("ok", f"observation {len(request.history) + 1}", None, None)]


def test_a_simulator_plays_episodes_as_a_gymnasium_environment():
    task = household_task(2)
    simulator = Scripted()
    record = run_episode(RandomPolicy(), SimulatorEnv(simulator, "text-game"), task, 2, task.episode_options())
    assert (record.end, record.steps) == ("truncated", task.max_steps)  # the task's step limit, from the options
    last = simulator.requests[-1]
    assert last.domain == "text-game" and last.system.initial_state == task.system.initial_state
    assert [(t.action, t.observation) for t in last.history] == list(record.history[:-1])
    with pytest.raises(RuntimeError, match="HTTP 500"):
        run_episode(Solver(), SimulatorEnv(Scripted(fails=2), "text-game"), task, 2, task.episode_options())


def test_the_command_says_what_to_run_first_in_one_line(tmp_path, prepared):
    empty = CliRunner().invoke(app, ["--set", f"workspace.path={tmp_path / 'empty'}", "fidelity"])
    assert empty.exit_code == 2
    assert empty.output.strip() == (
        f"fidelity: no store at {tmp_path / 'empty'}/simulacra.duckdb: run `simulacra ingest` first (or check "
        "`workspace.path`)"
    )
    assert not (tmp_path / "empty").exists()  # nothing made where nothing was
    unsplit = tmp_path / "unsplit"
    assert (
        CliRunner()
        .invoke(app, ["--set", f"workspace.path={unsplit}", "ingest", str(REPO / "data/demo/terminal.jsonl")])
        .exit_code
        == 0
    )
    before_split = CliRunner().invoke(app, ["--set", f"workspace.path={unsplit}", "fidelity"])
    assert before_split.exit_code == 2
    assert before_split.output.strip() == (
        "fidelity: no eval-pool trajectory to roll out: run `simulacra split` first (with an eval share), or give "
        "--data FILE"
    )
    workspace = tmp_path / "split-only"
    shutil.copytree(_config(prepared).workspace.root, workspace, ignore=shutil.ignore_patterns("runs"))
    with Store(workspace / "simulacra.duckdb") as store:
        store.execute("DELETE FROM checkpoints")
    unmodelled = CliRunner().invoke(app, ["--set", f"workspace.path={workspace}", "fidelity"])
    assert unmodelled.exit_code == 2
    assert (
        unmodelled.output.strip()
        == "fidelity: no model to measure: run `simulacra cpt` first, or give --checkpoint PATH"
    )
    unreadable = tmp_path / "unreadable.jsonl"
    unreadable.write_text("not json\n")
    nothing = CliRunner().invoke(app, ["--set", f"workspace.path={workspace}", "fidelity", "--data", str(unreadable)])
    assert nothing.exit_code == 2
    assert nothing.output.strip() == (
        f"fidelity: no trajectory with an environment turn to roll out in {unreadable}: 1 records read, 1 failed to "
        "parse"
    )
    nowhere = CliRunner().invoke(
        app, ["--set", f"workspace.path={workspace}", "fidelity", "--checkpoint", str(tmp_path / "nowhere")]
    )
    assert nowhere.exit_code == 2
    assert (
        nowhere.output.strip()
        == f"fidelity: --checkpoint {tmp_path / 'nowhere'}: not a model folder (no config.json there)"
    )
