"""The RL stage end to end on a real DuckDB store and the tiny model: GSPO steps, a SIGKILL mid-run, resume.

The store is filled with SQL (test_cpt_stage's small terminal world), then given an rl pool with one
target turn per trajectory, some carrying verifier code, and an eval pool. The stage runs as
`python -m stages.rl` in a child process that is killed once its first checkpoint is on disk; the
rerun must resume from that checkpoint, finish, and record one prompt per trajectory.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import yaml
from test_cpt_stage import fill_store

from pipeline.config import load_config
from pipeline.config.model import TinyModelConfig
from pipeline.errors import UserFixableError
from pipeline.rl.controls import KINDS
from pipeline.store.database import Store
from pipeline.training.models import tiny_model_dir
from pipeline.training.tiny_model import build_tiny_model
from stages import rl

VERIFIER = "def verify(prediction):\n    return prediction.strip() != ''\n"
RL_FIELDS = {
    "max_prompts": 8,
    "control_fraction": 0.5,
    "num_generations": 2,
    "per_device_batch_size": 4,
    "steps_per_generation": 2,  # off-policy second step: GSPO's sequence ratio in play
    "max_completion_length": 32,
    "learning_rate": 1e-3,
    "max_steps": 4,
    "save_steps": 1,
    # The random tiny model never writes the thinking format, so every reward is 0 and nothing can be
    # learnt: these tests exercise resume and reporting, and the stage says so in its metrics.
    "fail_when_nothing_learned": False,
}
# The thinking format (the tiny model is the only generator, so `auto` would be direct), and 2 validation targets.
SECTIONS = {"answers": {"thinking": True}, "validation": {"max_queries": 2, "max_tokens": 64}}


def rl_store(store: Store) -> None:
    """test_cpt_stage's terminal world; trajectories 0-11 form the rl pool (target: their last turn,
    every third with a verifier), 12-15 the val pool (target: turn 0), the rest cpt."""
    fill_store(store, n_trajectories=24)
    with store.transaction() as tx:
        tx.execute(
            "UPDATE splits SET pool = CASE WHEN trajectory_id < 'traj-012' THEN 'rl' "
            "WHEN trajectory_id < 'traj-016' THEN 'val' ELSE 'cpt' END"
        )
        tx.execute(
            "INSERT INTO targets SELECT trajectory_id, max(turn_index), 'rl', 'one', 0, 'test' FROM turns "
            "WHERE trajectory_id < 'traj-012' GROUP BY trajectory_id"
        )
        tx.execute(
            "INSERT INTO targets SELECT trajectory_id, 0, 'val', 'first', 0, 'test' FROM splits WHERE pool = 'val'"
        )
        tx.execute(
            "UPDATE turns SET metadata = ?::JSON FROM targets t WHERE t.pool = 'rl' AND turns.trajectory_id = "
            "t.trajectory_id AND turns.turn_index = t.turn_index AND right(t.trajectory_id, 1) IN ('0', '3', '6', '9')",
            [json.dumps({"verifier": VERIFIER})],
        )


def run_folder_listing(runs: Path) -> list[str]:
    """The RL runs' folders down to the trainer's checkpoints (and what was set aside), for a failure message."""
    return sorted(
        str(p.relative_to(runs))
        for pattern in ("*", "*/trainer/*", "*/trainer/incomplete/*", "*/trainer/staging/*")
        for p in runs.glob(pattern)
        if p.is_dir()
    )


@pytest.fixture
def workspace(tmp_path):
    config_file = tmp_path / "config.yaml"
    config_file.write_text(
        yaml.safe_dump({"workspace": {"path": str(tmp_path / "workspace")}, "rl": RL_FIELDS, **SECTIONS})
    )
    config = load_config(config_file)
    with Store(config.workspace.database_path) as store:
        rl_store(store)
        text = tmp_path / "corpus.txt"
        text.write_text("\n".join(row["observation"] for row in store.rows("SELECT observation FROM turns")) * 5)
    build_tiny_model(TinyModelConfig(), [text], tiny_model_dir(config))
    return config_file, config


def test_a_sigkilled_run_resumes_from_its_checkpoint_and_finishes(workspace):
    config_file, config = workspace
    config.workspace.keep_resume_checkpoints = True  # until the last part: it resumes from the last checkpoint
    # The child's stderr to a file, not a pipe: a pipe nobody reads until the end can fill and stall the child, and
    # reading it while the child runs would block.
    child_log = config_file.parent / "child-stderr.log"
    with child_log.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "stages.rl", "--config", str(config_file)],
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    runs = config.workspace.runs_dir / "rl"
    try:
        deadline = time.monotonic() + 300
        while child.poll() is None and time.monotonic() < deadline and not list(runs.glob("*/trainer/checkpoint-*")):
            time.sleep(0.1)
        assert list(runs.glob("*/trainer/checkpoint-*")), (
            f"no checkpoint before the child ended: {child_log.read_text(errors='replace')[-3000:]}"
        )
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    [run_dir] = [p for p in runs.iterdir() if (p / "fingerprint.json").is_file()]
    assert not (run_dir / rl.METRICS_FILE).exists()  # killed before the end
    left = run_folder_listing(runs)

    with Store(config.workspace.database_path) as store:
        result = rl.run(config, store)
        metrics = result.metrics
        # Once in eight full runs (2026-12-05, a benchmark running beside it) the rerun trained from step 0: say what
        # it found.
        assert metrics["resumed_from_step"] is not None, (
            f"the rerun found no checkpoint to resume; after the kill: {left}; after the rerun: "
            f"{run_folder_listing(runs)}; fingerprint {metrics['fingerprint']}; the killed child's stderr ends: "
            f"{child_log.read_text(errors='replace')[-1500:]}"
        )
        assert metrics["resumed_from_step"] >= 1 and metrics["first_step_this_run"] == metrics["resumed_from_step"]
        assert metrics["global_step"] == RL_FIELDS["max_steps"]
        assert "gradient norm 0" in metrics["learned_nothing"]
        # Rewards per step from the whole run, the steps before the kill included (kept in the checkpoint).
        curves = json.loads((run_dir / "reward_curves.json").read_text())
        # A rollout batch feeds 2 steps; the resumed run regenerates at its first step (the batch in
        # memory died with the process).
        steps = [step for step, _ in curves["reward"]]
        assert steps[0] == 1 and steps == sorted(set(steps)) and steps[-1] <= RL_FIELDS["max_steps"]
        assert any(step <= metrics["resumed_from_step"] for step in steps)
        assert any(step > metrics["resumed_from_step"] for step in steps)
        assert {"rewards/semantic/mean", "rewards/rule/mean", "completions/mean_length"} <= set(curves)
        assert metrics["reward_first_step"] is not None and metrics["val_score_before"] is not None
        # The reward of the starting and trained model on the same prompts; each reward's share (none: all 0).
        assert metrics["prompt_reward_prompts"] == RL_FIELDS["max_prompts"] and metrics["prompt_reward_before"] == 0.0
        # 4 completions a step in groups of 2: each step's reward is of other prompts, so the summary gives their
        # mean over the steps and says how many prompts made each, not a first -> last that reads as a trend.
        assert metrics["reward_mean_over_steps"] == pytest.approx(sum(v for _, v in curves["reward"]) / len(steps))
        assert "(mean over the steps, 2 prompt(s) a step; the curve follows the prompts)" in result.summary
        assert metrics["prompts_per_step"] == 2 and "(first step)" not in result.summary
        # Instruction-following on the held-out queries, each asked with one control instruction.
        for name in ("before", "after"):
            assert 0.0 <= metrics[f"heldout_control_following_{name}"] <= 1.0
            assert set(metrics[f"heldout_control_following_{name}_by_kind"]) <= set(KINDS)
        assert (run_dir / rl.REWARDS_PLOT).stat().st_size > 0 and (run_dir / "model" / "config.json").is_file()

        # The echo trap: no two prompts of the run come from one trajectory; the controls are recorded.
        recorded = store.rows("SELECT * FROM rl_prompts WHERE run = ?", [metrics["fingerprint"]])
        assert len(recorded) == RL_FIELDS["max_prompts"] == metrics["prompts"]
        assert len({row["trajectory_id"] for row in recorded}) == len(recorded)
        assert sum(row["control"] is not None for row in recorded) == metrics["prompts_with_control"] > 0
        assert all((row["control"] is None) == (row["instruction"] is None) for row in recorded)
        assert sum(row["has_verifier"] for row in recorded) == metrics["prompts_with_verifier"] > 0
        assert store.scalar("SELECT path FROM checkpoints WHERE stage = 'rl'") == str(run_dir / "model")

        again = rl.run(config, store)
    assert again.summary.startswith("already trained")

    # Killed after the last checkpoint, before trained.json (issue 20.12): no GSPO step beyond max_steps.
    (run_dir / rl.METRICS_FILE).unlink()
    (run_dir / rl.TRAINED_FILE).unlink()
    with Store(config.workspace.database_path) as store:
        finished = rl.run(config, store).metrics
    assert (finished["resumed_from_step"], finished["first_step_this_run"], finished["global_step"]) == (
        RL_FIELDS["max_steps"],
        None,
        RL_FIELDS["max_steps"],
    )

    # Complete, and the workspace does not keep resume checkpoints: the next run releases them, model kept.
    config.workspace.keep_resume_checkpoints = False
    with Store(config.workspace.database_path) as store:
        assert rl.run(config, store).summary.startswith("already trained")
    assert list(run_dir.glob("trainer/checkpoint-*")) == [] and (run_dir / "model" / "config.json").is_file()


def test_prompts_over_max_prompt_tokens_are_left_out_before_the_choice_and_counted(workspace):
    """`rl.max_prompt_tokens`: every prompt within it as TRL renders it (chat template, generation prompt),
    none over it, still up to `max_prompts` of them, and the count left out in the stage's selection record."""
    from pipeline.rl.prompts import prompt_tokens, read_prompts
    from pipeline.training.models import load_tokenizer

    _, config = workspace
    tokenizer = load_tokenizer(str(tiny_model_dir(config)))
    with Store(config.workspace.database_path) as store:
        everything = read_prompts(rl.prepare(config, store).prompts_path)
        lengths = sorted(prompt_tokens(tokenizer, prompt.messages) for prompt in everything)
        limit = lengths[len(lengths) // 2]
        capped = config.model_copy(
            update={"rl": config.rl.model_copy(update={"max_prompt_tokens": limit, "max_prompts": 3})}
        )
        plan = rl.prepare(capped, store)
    kept = read_prompts(plan.prompts_path)
    assert len(kept) == 3 and [p.prompt_index for p in kept] == [0, 1, 2]
    assert all(prompt_tokens(tokenizer, p.messages) <= limit for p in kept)
    selection = json.loads((plan.output_dir / rl.SELECTION_FILE).read_text())
    assert selection["prompts_too_long"] >= 1

    # None within it: one line naming the setting and the length that fits, where DuckDB's "executemany requires a
    # non-empty list" was the traceback.
    nothing_fits = config.model_copy(update={"rl": config.rl.model_copy(update={"max_prompt_tokens": 1})})
    with Store(config.workspace.database_path) as store, pytest.raises(UserFixableError) as refused:
        rl.prepare(nothing_fits, store)
    said = re.search(
        r"fits in rl.max_prompt_tokens \(1 tokens; the shortest prompt is (\d+)\): raise", str(refused.value)
    )
    assert said is not None and int(said[1]) <= lengths[0]


def test_direct_rl_rewards_the_observation_as_written_and_measures_its_prompts_before_and_after(workspace):
    """The direct format (issue 28): the completions are observations, so the random tiny model's get
    graded rewards (none is refused for lacking a thinking block), the weights move, the rule reward fires
    on the prompts with a verifier and its share is reported, and the reward on the training prompts is
    measured for the starting and the trained model, paired, with its interval."""
    from pipeline.prompts.answer_format import model_format

    _, config = workspace
    config = config.model_copy(
        update={
            "answers": config.answers.model_copy(update={"thinking": False}),
            "rl": config.rl.model_copy(
                update={"control_fraction": 0.0, "fail_when_nothing_learned": True, "max_steps": 2}
            ),
        }
    )
    with Store(config.workspace.database_path) as store, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = rl.run(config, store)
        [row] = store.rows("SELECT path FROM checkpoints WHERE stage = 'rl'")
    # TRL's reads of transformers' old checkpointing names are not the user's to fix: none reaches the log.
    assert not [str(w.message) for w in caught if "gradient_checkpointing" in str(w.message)]
    metrics = result.metrics
    assert metrics["answer_format"] == "rl-direct" and model_format(row["path"], "rl").name == "rl-direct"
    assert metrics["completions.missing_tags_rate.last"] == 0.0 and metrics["learned_nothing"] is None
    assert metrics["prompts_with_rule_reward"] > 0 and metrics["reward_share.rule"] > 0
    assert metrics["reward_share.semantic"] + metrics["reward_share.rule"] == pytest.approx(1.0)
    assert metrics["rule_steps"] >= 1 and 0 < metrics["rule_pass_rate"] <= 1
    assert f"verifiers ran at {metrics['rule_steps']} step(s)" in result.summary
    assert metrics["prompt_reward_prompts"] == RL_FIELDS["max_prompts"]
    assert (
        metrics["prompt_reward_change_low"] <= metrics["prompt_reward_change"] <= metrics["prompt_reward_change_high"]
    )
    assert metrics["val_format_after"] == "rl-direct"
    # The summary names the model RL started from: with no SFT or CPT checkpoint registered, the workspace's base.
    assert result.summary.startswith(f"from {Path(metrics['base_model']).name}, rl-direct format: 2 GSPO steps")
    assert "reward on its 8 prompts (greedy)" in result.summary
    from pipeline.rl.prompts import read_prompts

    prompts = read_prompts(Path(row["path"]).parent / rl.PROMPTS_FILE)
    assert prompts and all("<think>" not in p.messages[0]["content"] for p in prompts)


def test_the_summary_says_when_verifiers_ran_and_passed_nothing():
    """The demo's run: a verifier at 2 of 8 steps, no completion passing it. A rule share of 0% alone reads as
    if the rule reward never ran; the summary says it ran and what it passed."""
    curves = {
        "rewards/semantic/mean": [(step, 10.0) for step in range(1, 9)],
        "rule/coverage": [(step, 1.0 if step in (3, 8) else 0.0) for step in range(1, 9)],
        "rewards/rule/mean": [(3, 0.0), (8, 0.0)],
        "rule/pass_rate": [(3, 0.0), (8, 0.0)],
    }
    metrics = {
        **rl.reward_shares(curves, 0.9, 0.1, "semantic"),
        **rl.rule_verdicts(curves),
        "global_step": 8,
        "prompts": 8,
        "reward_first_step": 10.0,
        "reward_last_step": 9.0,
    }
    assert metrics["rule_steps"] == 2 and metrics["rule_pass_rate"] == 0.0
    assert "rule 0% (verifiers ran at 2 step(s), passed 0%), semantic 100%" in rl._summary(metrics)
    passing = {**curves, "rule/pass_rate": [(3, 0.5), (8, 1.0)], "rule/coverage": [(3, 0.5), (8, 1.0)]}
    assert rl.rule_verdicts(passing)["rule_pass_rate"] == pytest.approx((0.5 * 0.5 + 1.0) / 1.5)
    assert rl.rule_verdicts({"rewards/semantic/mean": [(1, 1.0)]}) == {"rule_steps": 0}
    assert "verifiers ran" not in rl._summary({**metrics, **rl.rule_verdicts({})})
