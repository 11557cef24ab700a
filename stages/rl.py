"""Stage 3, GSPO reinforcement learning (SPEC.md; issue 11): the world model's predictions rewarded by a judge and verifiers.

Three steps, as CPT and SFT, so a GPU deployment can run the middle one (flows/gpu_stage.py):
1. `prepare` (data side, the store): the model RL starts from (`rl.base_model`, else the newest
   registered SFT checkpoint, else CPT's, else `model.base` / the workspace's tiny model); a Parquet
   snapshot of the rl and val pools; the fingerprint and the run's folder; the prompts
   (pipeline/rl/prompts.py: the rl pool's one target turn per trajectory, a seeded choice of
   `rl.max_prompts` among those within `rl.max_prompt_tokens`, in the RL template, with the turn's
   verifier and a seeded control instruction on `rl.control_fraction` of them), in the answer format
   `answers.thinking` chooses (issue 28), written to `prompts.jsonl` and recorded in `rl_prompts`;
   the validation targets (pipeline/training/validation.py);
2. `train` (every training process, files only, never the store): GSPO with TRL's GRPOTrainer
   (pipeline/rl/training.py), rewards from pipeline/rl/rewards.py, resuming from the newest complete
   checkpoint of the run's folder; then, on the main process, the reward of the starting and the
   trained model on the same training prompts (pipeline/rl/prompt_rewards.py), the validation score
   of both, the predictions with a control instruction each where RL trains them; the reward curves
   as a PNG and each reward's share of the combined one; `trained.json` last;
3. `record` (data side): the rule of each control kind scores the controlled predictions (where
   `rl.control_fraction` > 0: the instruction-following rate); the checkpoint is registered,
   `metrics.json` last (its presence marks the run complete).

Caches that are not the store: the judge's answers during training go to a DuckDB file per training
process (`judge_cache/rank-<n>.duckdb`), the held-out generations to `heldout_cache.duckdb`, both in
the run's folder: training never holds the store (STACK.md: one process per DuckDB file), and
processes cannot share one file. A rerun after a kill resumes from a checkpoint; judge answers to
completions it regenerates identically are read from that cache, not asked again.
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import SimulacraConfig
from pipeline.errors import UserFixableError
from pipeline.rl.base_model import rl_base_ref
from pipeline.stage import StageResult
from pipeline.store.atomic_files import write_text_atomic
from pipeline.store.prerequisites import require_ingested
from pipeline.store.snapshot import target_turns
from pipeline.training.runs import (
    RunPlan,
    claim_run_folder,
    complete_run,
    launch_from_command_line,
    model_words,
    run_across_processes,
)

STAGE = "rl"
POOLS = ("rl", "val")
METRICS_FILE = "metrics.json"
PROMPTS_FILE = "prompts.jsonl"
SELECTION_FILE = "prompt_selection.json"  # what the prompt choice left out
TRAINED_FILE = "trained.json"
REWARDS_PLOT = "rewards.png"


@dataclass(slots=True)
class Plan(RunPlan):
    """What training needs, decided on the data side; also what `record` needs to finish there."""

    # The resolved config: `record` rebuilds the judge from it (a GPU dispatch hands it only the plan).
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def prompts_path(self) -> Path:
        return self.output_dir / PROMPTS_FILE


def _plan(config, store) -> Plan:
    from pipeline.store.snapshot import export_snapshot, pools_fingerprint

    require_ingested(store)  # before "run `simulacra sft` first", which an empty store does not need first
    base_ref = rl_base_ref(config, store)
    if not target_turns(store, "rl"):
        raise UserFixableError(
            "pool 'rl' has no target turns: run `simulacra split` first (or give the rl pool a share)"
        )
    pools = pools_fingerprint(store, POOLS)
    snapshot = export_snapshot(store, config.workspace.runs_dir / STAGE / "snapshots" / pools.replace(":", "-"), POOLS)
    output_dir, fingerprint = claim_run_folder(config, store, STAGE, config.rl.output_dir)
    return Plan(
        output_dir,
        snapshot,
        fingerprint,
        base_ref,
        done=(output_dir / METRICS_FILE).is_file(),
        keep_resume_checkpoints=config.workspace.keep_resume_checkpoints,
        config=config.model_dump(mode="json"),
    )


# -- 2. prompts -----------------------------------------------------------------------------------
def _prompts(config, store, plan: Plan):
    from pipeline.rl.prompts import build_prompts, select_targets, verified_turns, verifiers, write_prompts
    from pipeline.sft.queries import choose_targets, load_queries

    rl = config.rl
    too_long, shortest = 0, None
    ranked = select_targets(target_turns(store, "rl"), None, rl.seed)
    if rl.max_prompt_tokens is None and not rl.verifier_share:
        ranked = ranked[: rl.max_prompts] if rl.max_prompts is not None else ranked
    queries = load_queries(plan.snapshot_dir, "rl", ranked, rl.max_history_chars)
    if rl.max_prompt_tokens is not None:  # the long ones left out before the choice
        queries, too_long, shortest = _fitting(config, plan, queries)
    code = verifiers(store, [(q.trajectory_id, q.turn_index) for q in queries])
    alternates: list = []
    if rl.verifier_share and rl.max_prompts is not None:
        # A trajectory's one target is a seeded turn, rarely the one its verifier checks (the demo's terminal
        # verifiers check a final count): its verified turns stand in for it when a verified prompt is wanted.
        verified = [turn for turn in verified_turns(store, "rl") if turn not in code]
        alternates = load_queries(
            plan.snapshot_dir, "rl", choose_targets(verified, None, rl.seed), rl.max_history_chars
        )
        if rl.max_prompt_tokens is not None:
            alternates, _, _ = _fitting(config, plan, alternates)
        code |= verifiers(store, [(q.trajectory_id, q.turn_index) for q in alternates])
    queries = choose_with_verifiers(queries, code, rl.max_prompts, rl.verifier_share, alternates)
    if not queries and too_long:
        # Else DuckDB's "executemany requires a non-empty list" below, a traceback (SFT says the same of sft.max_length).
        raise UserFixableError(
            f"none of the rl pool's {too_long} target turns fits in rl.max_prompt_tokens ({rl.max_prompt_tokens} "
            f"tokens; the shortest prompt is {shortest}): raise rl.max_prompt_tokens to at least {shortest}, or "
            "shorten rl.max_history_chars"
        )
    fmt = _format(config)
    prompts = build_prompts(queries, code, rl.control_fraction, rl.seed, fmt.thinking)
    write_prompts(plan.prompts_path, prompts)
    write_text_atomic(
        plan.output_dir / SELECTION_FILE, json.dumps({"prompts_too_long": too_long, "answer_format": fmt.name}) + "\n"
    )
    with store.transaction() as tx:
        tx.execute("DELETE FROM rl_prompts WHERE run = ?", [plan.fingerprint])
        tx.executemany(
            "INSERT INTO rl_prompts VALUES (?, ?, ?, ?, ?, ?, ?, ?, now())",
            [
                [
                    plan.fingerprint,
                    p.prompt_index,
                    p.trajectory_id,
                    p.turn_index,
                    p.domain,
                    p.verifier is not None,
                    p.control,
                    p.control_instruction,
                ]
                for p in prompts
            ],
        )
    return prompts


def choose_with_verifiers(ranked, code: dict, limit: int | None, share: float, alternates=()):
    """`limit` queries in rank order, of which at least ceil(share x limit) carry a verifier where that many
    exist (`rl.verifier_share`): the first verified ones in rank, then verified `alternates` (other turns of
    the ranked queries' trajectories, in their own seeded order), each in its trajectory's place (one turn a
    trajectory, SPEC's echo trap), then the rest in rank; the result stays in rank order (an alternate where
    its trajectory's target was), so a run takes the same prompts every time."""
    import math

    if limit is None or limit >= len(ranked):
        return list(ranked)
    wanted = min(math.ceil(share * limit), limit)
    verified = [q for q in ranked if (q.trajectory_id, q.turn_index) in code][:wanted]
    place = {q.trajectory_id: i for i, q in enumerate(ranked)}
    taken = {q.trajectory_id for q in verified}
    for alternate in alternates:
        if len(verified) == wanted:
            break
        if alternate.trajectory_id in place and alternate.trajectory_id not in taken:
            verified.append(alternate)
            taken.add(alternate.trajectory_id)
    rest = [q for q in ranked if q.trajectory_id not in taken][: limit - len(verified)]
    return sorted(verified + rest, key=lambda q: place[q.trajectory_id])


def _fitting(config, plan: Plan, queries):
    """The queries whose RL prompt (control instruction included) fits `rl.max_prompt_tokens` in the policy's
    tokenizer and chat template, as TRL renders it, in their order; how many did not; the shortest prompt's tokens."""
    from pipeline.rl.prompts import build_prompts, prompt_tokens
    from pipeline.training.trainer import load_tokenizer_with_chatml

    tokenizer, _ = load_tokenizer_with_chatml(config, plan.base_ref)
    rl = config.rl
    prompts = build_prompts(queries, {}, rl.control_fraction, rl.seed, _format(config).thinking)
    lengths = [prompt_tokens(tokenizer, prompt.messages) for prompt in prompts]
    fits = [length <= rl.max_prompt_tokens for length in lengths]
    return [query for query, fit in zip(queries, fits) if fit], fits.count(False), min(lengths, default=None)


def _format(config):
    """RL trains in RL's template, thinking or direct as `answers.thinking` says (issue 28)."""
    from pipeline.config.answers import resolve_thinking
    from pipeline.prompts.answer_format import stage_format

    return stage_format(STAGE, resolve_thinking(config))


def _run_format(plan: Plan):
    from pipeline.prompts.answer_format import answer_format

    return answer_format(json.loads((plan.output_dir / SELECTION_FILE).read_text())["answer_format"])


# -- 3. training ----------------------------------------------------------------------------------
def _rewards(config, plan: Plan, prompts, tokenizer):
    """The reward functions of this process; an LLM judge caches its answers in a file of its own."""
    from accelerate import PartialState

    from pipeline.rl.rewards import Rewards

    judge = None
    reward = config.rl.reward
    if reward.judge.kind == "llm":
        from pipeline.llm.client import open_client
        from pipeline.rl.judge import RubricJudge
        from pipeline.store.database import Store

        cache = Store(plan.output_dir / "judge_cache" / f"rank-{PartialState().process_index}.duckdb")
        judge = RubricJudge(
            open_client(reward.judge.endpoint, cache, "rl.judge", seed=config.rl.seed), reward.judge.history_turns
        )
    return Rewards(prompts, tokenizer, reward, judge, _run_format(plan).thinking), judge


# -- 4. results -----------------------------------------------------------------------------------
def reward_curves(history: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """Per-step series from TRL's log entries: every reward component, the combined reward, the
    judge's failure rate, the completion length and the tags and rule rates."""
    series: dict[str, list[tuple[int, float]]] = {}
    for entry in history:
        for key, value in entry.items():
            wanted = key in (
                "reward",
                "judge/failure_rate",
                "completions/mean_length",
                "completions/missing_tags_rate",
                "rule/coverage",
                "rule/pass_rate",
                "control/following_rate",
            ) or (key.startswith("rewards/") and key.endswith("/mean"))
            if wanted and isinstance(value, (int, float)) and value == value:  # NaN: no sample of that kind
                series.setdefault(key, []).append((entry["step"], float(value)))
    return series


def _plot(path: Path, curves: dict[str, list[tuple[int, float]]], weights: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    for key, series in curves.items():
        steps, values = [s for s, _ in series], [v for _, v in series]
        if key == "reward" or key.startswith("rewards/"):
            top.plot(steps, values, marker=".", label=f"combined ({weights})" if key == "reward" else key.split("/")[1])
        elif key == "completions/mean_length":
            bottom.plot(steps, values, marker=".", label="mean completion length (tokens)")
        else:
            middle.plot(steps, values, marker=".", label=key)
    top.set_ylabel("reward (0-25)")
    top.set_title("GSPO: rewards per optimizer step")
    middle.set_ylabel("rate")
    bottom.set_ylabel("tokens")
    bottom.set_xlabel("optimizer step")
    for axes in (top, middle, bottom):
        if axes.lines:
            axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _summary(metrics: dict[str, Any]) -> str:
    def number(value):
        return "n/a" if value is None else f"{value:.2f}"

    resumed = f", resumed from step {metrics['resumed_from_step']}" if metrics.get("resumed_from_step") else ""
    too_long = (
        f" ({metrics['prompts_too_long']} over rl.max_prompt_tokens left out)"
        if metrics.get("prompts_too_long")
        else ""
    )
    per_step = metrics.get("prompts_per_step")
    # Each step's reward is of other prompts: with one or two a step, first step -> last step (10.12 -> 5.18 in
    # a demo) read as a fall that was the prompts'. The summary gives the mean over the steps; the change is the
    # paired one on the same prompts, before and after, beside it.
    steps_apart = f", {per_step} prompt(s) a step" if per_step else ""
    from pipeline.evaluation.intervals import Interval, change_words
    from pipeline.training.validation import summary_words

    on_prompts = ""
    if metrics.get("prompt_reward_after") is not None:
        change = Interval(
            metrics["prompt_reward_change"],
            metrics["prompt_reward_change_low"],
            metrics["prompt_reward_change_high"],
            metrics["prompt_reward_prompts"],
        )
        on_prompts = (
            f"; reward on its {metrics['prompt_reward_prompts']} prompts (greedy) "
            f"{number(metrics['prompt_reward_before'])} -> {number(metrics['prompt_reward_after'])}, "
            f"{change_words(change)}"
        )
    judged = (
        f" (verifiers ran at {metrics['rule_steps']} step(s), passed {metrics['rule_pass_rate']:.0%})"
        if metrics.get("rule_steps")
        else ""
    )
    shares = [
        f"{key.split('.', 1)[1]} {value:.0%}" + (judged if key == "reward_share.rule" else "")
        for key, value in sorted(metrics.items())
        if key.startswith("reward_share.")
    ]
    scored = summary_words(metrics)
    started = f"from {model_words(metrics['base_model'])}, " if metrics.get("base_model") else ""
    return (
        f"{started}{metrics.get('answer_format', 'rl-thinking')} format: "
        f"{metrics['global_step']} GSPO steps on {metrics['prompts']} prompts ({metrics.get('prompts_with_rule_reward', 0)} "
        f"with a verifier){too_long}{resumed}; training reward {number(metrics.get('reward_mean_over_steps'))} "
        f"(mean over the steps{steps_apart}; the curve follows the prompts)"
        + (f", shares of the reward: {', '.join(shares)}" if shares else "")
        + on_prompts
        + (f"; {scored}" if scored else "")
        + (
            f"; held-out instruction-following {number(metrics['heldout_control_following_before'])} -> "
            f"{number(metrics['heldout_control_following_after'])}"
            if "heldout_control_following_before" in metrics
            else ""
        )
        + (f"; LEARNED NOTHING: {metrics['learned_nothing']}" if metrics.get("learned_nothing") else "")
    )


def _tables(plan: Plan, prompts) -> dict[str, list[dict[str, Any]]]:
    counted = Counter((p.domain, p.control or "-", p.verifier is not None) for p in prompts)
    rows = [{"domain": d, "control": c, "verifier": v, "prompts": n} for (d, c, v), n in sorted(counted.items())]
    return {"rl-prompts": rows}


def _result(plan: Plan, metrics: dict[str, Any], tables, summary: str) -> StageResult:
    plot = plan.output_dir / REWARDS_PLOT
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=plan.model_dir,
        summary=summary,
        tables=tables,
        images={"rl-rewards": plot} if plot.is_file() else {},
    )


# -- the three steps: prepare (data side), train (training side), record (data side) ---------------
def prepare(config, store) -> Plan:
    """Everything that reads or writes the store: the plan, the prompts, the validation targets."""
    from pipeline.training import validation

    plan = _plan(config, store)
    if not plan.done:
        prompts = _prompts(config, store, plan)
        validation.write_targets(plan.output_dir, validation.choose(store, config, plan.snapshot_dir))
        _check_budgets(
            config,
            plan,
            [p.reference for p in prompts],
            validation.read_queries(config, plan.output_dir, plan.snapshot_dir),
        )
    return plan


def _check_budgets(config, plan: Plan, rollout_references: list[str], validation_queries) -> None:
    """Completions must hold the answers they are rewarded on: the observation and, for a model SFT
    taught to think, its thinking (issue 16.4: 48-token completions for 200-token answers made every
    reward equal and every gradient 0)."""
    from pipeline.training import validation
    from pipeline.training.budgets import answer_tokens, percentile_95, require_budget, thinking_allowance
    from pipeline.training.models import load_tokenizer

    tokenizer = load_tokenizer(plan.base_ref, config.model.trust_remote_code)
    thinking = thinking_allowance(plan.base_ref) if _run_format(plan).thinking else 0
    what = "the observations" + (" plus the thinking SFT taught" if thinking else "")
    require_budget(
        "rl.max_completion_length",
        config.rl.max_completion_length,
        percentile_95(answer_tokens(tokenizer, rollout_references)) + thinking,
        f"{what} of the rl prompts",
    )
    validation.check_budget(config, tokenizer, validation_queries, thinking)


def train(config, plan: Plan) -> None:
    """Every process, from the plan's files only (never the store): GSPO (resuming from the newest
    complete checkpoint), then on the main process the reward of the starting and the trained model on
    the training prompts, the validation score of both, the instruction-following where RL trains
    controls, the reward curves; the main process writes `trained.json` last."""
    from pipeline.prompts.answer_format import model_format, write_model_format
    from pipeline.rl.heldout import heldout_predictions
    from pipeline.rl.prompt_rewards import measure_prompt_rewards, prompt_reward_metrics
    from pipeline.rl.prompts import read_prompts
    from pipeline.rl.training import RLLearnedNothing, learned_nothing_reason, train_gspo
    from pipeline.training import validation
    from pipeline.training.trainer import load_tokenizer_with_chatml

    rl = config.rl
    trained_file = plan.output_dir / TRAINED_FILE
    if plan.done or trained_file.is_file():
        return
    fmt = _run_format(plan)
    prompts = read_prompts(plan.prompts_path)
    tokenizer, _ = load_tokenizer_with_chatml(config, plan.base_ref)
    rewards, judge = _rewards(config, plan, prompts, tokenizer)
    outcome = train_gspo(config, plan.base_ref, tokenizer, prompts, rewards, plan.trainer_dir, plan.model_dir)
    if judge is not None:
        judge.client.check_failures()  # a judge that failed past max_failed_fraction fails the stage
    if not outcome.is_main_process:
        return
    reason = learned_nothing_reason(outcome)
    if reason is not None and rl.fail_when_nothing_learned:
        # No trained.json: the run stays incomplete, and a rerun with other settings is a new run.
        raise RLLearnedNothing(reason)  # the CLI and the flow name the stage
    write_model_format(plan.model_dir, fmt)
    # The reward RL optimises, on its own prompts, by the model it started from and the one it trained.
    prompt_rewards = {
        name: measure_prompt_rewards(prompts, ref, rl.max_completion_length, plan.output_dir, name, rewards)
        for name, ref in (("before", plan.base_ref), ("after", str(plan.model_dir)))
    }
    queries = validation.read_queries(config, plan.output_dir, plan.snapshot_dir)
    measured = validation.measure(
        config, queries, plan.output_dir, (plan.base_ref, model_format(plan.base_ref, None)), (str(plan.model_dir), fmt)
    )
    if rl.control_fraction > 0:  # instruction-following on the validation targets, each with one instruction
        for name, ref in (("before", plan.base_ref), ("after", str(plan.model_dir))):
            heldout_predictions(
                queries, ref, config.validation.max_tokens, plan.output_dir, [(f"{name}_control", True)], fmt
            )
    curves = reward_curves(outcome.history)
    weights = f"{rl.reward.main_weight:g} x {rewards.main_name} + {rl.reward.rule_weight:g} x rule"
    _plot(plan.output_dir / REWARDS_PLOT, curves, weights)
    write_text_atomic(plan.output_dir / "reward_curves.json", json.dumps(curves) + "\n")
    combined = curves.get("reward", [])
    trained = {
        "main_reward": rewards.main_name,
        "reward_weights": weights,
        "reward_first_step": combined[0][1] if combined else None,
        "reward_last_step": combined[-1][1] if combined else None,
        "reward_mean_over_steps": sum(value for _, value in combined) / len(combined) if combined else None,
        **{f"{key.replace('/', '.')}.last": series[-1][1] for key, series in curves.items() if series},
        **reward_shares(curves, rl.reward.main_weight, rl.reward.rule_weight, rewards.main_name),
        **rule_verdicts(curves),
        **prompt_reward_metrics(prompt_rewards["before"], prompt_rewards["after"]),
        **measured,
        "global_step": outcome.global_step,
        "parameters_changed": outcome.parameters_changed,
        "prompts_per_step": outcome.prompts_per_step,
        "learned_nothing": reason,
        "first_step_this_run": outcome.first_step_this_run,
        "resumed_from_step": outcome.resumed_from_step,
        "reward_plot": str(plan.output_dir / REWARDS_PLOT),
    }
    write_text_atomic(trained_file, json.dumps(trained, indent=2, sort_keys=True) + "\n")


def rule_verdicts(curves: dict[str, list[tuple[int, float]]]) -> dict[str, float]:
    """At how many steps a verifier judged completions, and the share it passed (weighted by each step's
    coverage): a rule share of 0% says the rule reward gave nothing, this says whether it ran at all."""
    coverage = {step: value for step, value in curves.get("rule/coverage", []) if value > 0}
    passed = dict(curves.get("rule/pass_rate", []))
    judged = [(coverage[step], passed[step]) for step in coverage if step in passed]
    if not judged:
        return {"rule_steps": 0}
    return {"rule_steps": len(judged), "rule_pass_rate": sum(c * p for c, p in judged) / sum(c for c, _ in judged)}


def reward_shares(
    curves: dict[str, list[tuple[int, float]]], main_weight: float, rule_weight: float, main_name: str
) -> dict[str, float]:
    """Each reward's share of the combined reward over the run (the weighted means of TRL's per-step
    means, summed over steps): whether the rule reward, the 1 of 9:1, fired at all. The rule's step
    mean is over the completions it applies to, so its share is weighted by its coverage."""
    main = sum(v for _, v in curves.get(f"rewards/{main_name}/mean", []))
    coverage = dict(curves.get("rule/coverage", []))
    rule = sum(v * coverage.get(step, 0.0) for step, v in curves.get("rewards/rule/mean", []))
    total = main_weight * main + rule_weight * rule
    if total <= 0:
        return {}
    return {f"reward_share.{main_name}": main_weight * main / total, "reward_share.rule": rule_weight * rule / total}


def _is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState().is_main_process


def record(store, plan: Plan) -> StageResult:
    """On the data side, after `train`: the instruction-following rates, register the checkpoint, report."""
    from pipeline.rl.heldout import heldout_control_following
    from pipeline.rl.prompts import read_prompts
    from pipeline.training import validation

    prompts = read_prompts(plan.prompts_path)
    metrics_file = plan.output_dir / METRICS_FILE
    if metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        summary = f"already trained: {_summary(metrics)} ({plan.output_dir})"
    else:
        trained_file = plan.output_dir / TRAINED_FILE
        if not trained_file.is_file():
            raise RuntimeError(f"{STAGE}: {trained_file} is missing: training did not finish")
        config = SimulacraConfig.model_validate(plan.config)
        queries = validation.read_queries(config, plan.output_dir, plan.snapshot_dir)
        following = {}
        if config.rl.control_fraction > 0:  # instruction-following on the same queries, each with one instruction
            for name in ("before", "after"):
                measured = heldout_control_following(queries, plan.output_dir, f"{name}_control", _run_format(plan))
                following[f"heldout_control_following_{name}"] = measured["following_rate"]
                following[f"heldout_control_following_{name}_by_kind"] = measured["by_kind"]
        metrics = {
            "prompts": len(prompts),
            "prompts_with_control": sum(1 for p in prompts if p.control),
            "prompts_with_verifier": sum(1 for p in prompts if p.verifier is not None),
            # A control instruction sets the verifier aside (pipeline/rl/rewards.py).
            "prompts_with_rule_reward": sum(1 for p in prompts if p.verifier is not None and not p.control),
            **_selection(plan),
            **json.loads(trained_file.read_text()),
            **following,
            "fingerprint": plan.fingerprint,
            "base_model": plan.base_ref,
        }
        summary = _summary(metrics)
    complete_run(store, STAGE, plan, metrics, metrics_file)
    return _result(plan, metrics, _tables(plan, prompts), summary)


def _selection(plan: Plan) -> dict[str, Any]:
    path = plan.output_dir / SELECTION_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def run(config, store) -> StageResult:
    return run_across_processes(STAGE, prepare, train, record, config, store)


def main(argv: list[str] | None = None) -> None:
    launch_from_command_line(STAGE, run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
