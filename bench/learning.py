"""What each training stage teaches (issue 28, item 5; `make learn`): base -> cpt -> sft -> rl at several times the
demo's budgets, every model scored on public trajectories none of them was trained on.

    .venv/bin/python bench/learning.py [--data FILE...] [--workspace bench-workspace/learning]
        [--config data/configs/demo.yaml] [--set KEY=VALUE ...]

Runs the pipeline's own commands (`simulacra ingest`, `filter`, `score`, `split`, `cpt`, `sft`, `rl`, each a
subprocess, as a user runs them) in a workspace of its own, never the demo's, with training budgets larger
than the config's; then `simulacra evaluate --data FILE...` (the base model, the newest cpt, sft and rl
checkpoints and the retrieval baseline, on the files' target turns as given: pipeline/evaluation/benchmark.py)
and `simulacra export` (the checkpoint with the best validation score). Every stage is resumable, so a rerun
after a kill continues where it stopped, and a rerun after a finished one only evaluates and exports again
(reused, not recomputed).

The eval set: by default the public trajectories beside the repository (`../shared/data/public`: ALFWorld
from AgentBench and from ReAct, text-game; mini-SWE-agent's run, swe), at most 51 target turns a folder
(`evaluate.benchmark.max_items_per_path`, a seeded choice, the same at every run): 39 + 51 + 10 = 100
targets, 90 text-game and 10 swe, none in a training pool (the demo trains on data/demo). SWE-agent's
demonstrations are left out by default: their prompts run to 1,000-3,000 tokens and their p95 observation to
917 tokens, and a greedy answer costs about 4.5 s at the demo's 750-token prompts on 2 cores (prefill at about
260 tokens/s, measured 2026-12-02), so 42 of them would take about 10 minutes per model; `--data` adds them. Nothing is tuned on them, nor on the eval pool: budgets are chosen on the validation pool, whose
score every stage reports. Two settings follow the eval set, each unless `--set` gives it: a benchmark item
gets the history the checkpoints were trained on (`evaluate.benchmark.max_history_chars` =
`evaluate.max_history_chars`; a whole history would overrun the training window and score the truncation),
and `evaluate.predictor.max_tokens` is raised to the p95 of the targets' observations in the base model's
tokenizer, the budget `simulacra evaluate` requires (917 tokens on the default set: SWE-agent's file views).
A thinking run (`answers.thinking: true`) needs its thinking on top: `simulacra evaluate` says how much.

Budgets, read from the config and scaled (BUDGETS); a `--set` of one of these fields is taken as given:
  cpt.max_steps as the demo's (32), cpt.tokens_per_step x2 (two rows of 1,024 tokens a step), cpt.mixed_precision
  the model's (UNSET: float32 on a CPU, where the demo's CPT runs under bf16 autocast on a CPU with bfloat16
  instructions), sft.max_queries x3, sft.max_steps x3, rl.max_steps
  x6 in groups of 4 completions (FIXED, where the demo trains groups of 2), rl.max_prompts x3, 4 groups an RL step
  (RL_PROMPTS_PER_STEP: rl.gradient_accumulation_steps and rl.steps_per_generation 4, rl.max_steps divided by 4),
  rl.learning_rate x3; and 32 validation targets (VALIDATION_TARGETS; the demo asks 24) with answers of up to
  200 tokens (FIXED; the demo caps its 24 at 128).
On the demo config: 32 CPT steps of 2,048 tokens (64 rows, 0.26 of an epoch); 18 SFT steps of 1,024 tokens on up
to 192 queries (the direct format: the real observations, nothing generated); 12 GSPO steps on 24 prompts, 4
prompts (a group of 4 completions each) a step, so each prompt is trained on twice; 32 validation targets. RL's budget was chosen on the
validation pool (2026-12-03, docs/performance.md): from the same SFT checkpoint, 24 steps of groups of 2 moved
its validation score +2.2 [-1.5, +6.4], 48 steps of groups of 4 +8.2 [+1.5, +16.8]; from 94da898's SFT checkpoint
48 steps of one group moved it -2.1 [-6.0, +1.7], 24 of one -3.1 [-6.8, +0.4], and 12 steps of 4 groups (the same 48
groups) +2.3 [+0.4, +4.7], so RL trains 4 prompts a step; at 3e-5 in place of 1e-5 those 12 steps moved it +3.6
[-0.9, +9.4] to 52.7 (1e-5: 51.4), so its learning rate is 3x the config's. CPT's 32 steps stay: 64 moved
validation to 43.4 against 43.9 (CE 0.632 against 0.795). Two rows a step instead of one was chosen on the demo's 57
validation targets over three seeds, by a rule fixed before the third (2026-12-06, docs/performance.md): 46.6, 45.4
and 43.4 at seeds 0, 1 and 2 (mean 45.1) against one row's 46.0, 34.9 and 42.1 (mean 41.0). Every stage's checkpoint is
evaluated (`evaluate.checkpoints=newest`, where the demo evaluates the shipped one only).

How long, estimated for 2 idle cores and SmolLM2-135M-Instruct in float32 from unit costs measured on
2026-12-02 (the demo's stages: an optimizer step of 1,024 tokens about 11 s, a greedy answer about 4.5 s at
750-token prompts, most of it prefill; a GSPO step 20-30 s): ingest to split 1 min; cpt 12 min (2 rows a
step; 18-21 on the Zen 1 host of 2026-12-06) and its two validation passes (32 answers each) 5 min; sft 6 min and a
validation pass 2.5 min; rl 20-25 min (48 steps of 4 completions), its reward on its 24 prompts before and after
2 min and a validation pass 2.5 min; evaluate, 4 models x 100 targets (text games' prompts are shorter than the
demo's average) plus the free retrieval baseline: 15-35 min; export under 1 min. Measured end to end (docs/performance.md): 35 min 15 s on 2026-12-02 with RL's 24 steps of 2;
47 min 26 s on 2026-12-03 with its 48 steps of 4 (rl 22 min), two other experiments running beside it; 37 min 43 s
at cc30809 in a copy of that run's workspace, its base and cpt answers found in the LLM cache (cpt 10 min, sft 4, rl 18,
evaluate 6); 34 min 27 s at 94da898 in a copy of that one, its base answers cached (cpt 13, sft 3.5, rl 14, evaluate
4.5); 41 min 5 s in a fresh clone of 18ca645 with RL's 4 prompts a step, a test suite beside it for 11 minutes (cpt
13, sft 3, rl 18, evaluate 6); 45 min 53 s in a fresh clone of 675d27c with RL at 3e-5, a test suite and another run
beside it for its first 16 minutes (cpt 16, sft 7, rl 16, evaluate 6); 30 min 58 s in a fresh clone of af96bde, whose CPU
default was bf16 autocast, since dropped (cpt 8.5, sft 4.7, rl 10.9, evaluate 6); 40 min 29 s in a fresh clone of
2f7780d, float32 again, a test run beside its CPT (cpt 8, sft 3.5, rl 19.7, evaluate 8); 28 min 49 s in a fresh clone of
d575a45 (packed rows attended per sequence, RL's LM head on its completions only: every number the same to the
digit) on an AVX2-only host, a test suite beside it for its first minute (cpt 6.7, sft 3.1, rl 12.6, evaluate 6).
With CPT at two rows a step: 103 min 48 s in a fresh clone of 9a42812 on 2026-12-06 on a Zen 1 host without bf16
(CPT 37 s a step), a test suite beside it for 23 minutes (cpt 24, sft 15.5, rl 45, evaluate 18); 81 min 6 s in a
fresh clone of d89741f on the same host with nothing beside it (cpt 21, sft 7, rl 36, evaluate 16), within its 90.

What it prints, and writes to `<workspace>.json`:
- the overall table, and every model against the base model and the retrieval baseline (difference, ratio);
- each stage's gain over the one it started from on the public targets (cpt vs base, sft vs cpt, rl vs sft):
  the paired difference of the score with its 95% bootstrap interval, as the report's `comparisons`
  (pipeline/evaluation/comparison.py), in words (improved, no measurable change, WORSE), and beside it the
  stage's own change on the validation pool (its run's metrics.json);
- which checkpoint `simulacra export` shipped and why, and its gain over the base model and over the
  retrieval baseline on the targets not seen in training (`score_unseen`: on the public files, all of them);
- RL's reward curve (its run's rewards.png, copied to `<workspace>.rewards.png`) and its reward on its own
  prompts before and after training;
- the four targets of issue 28, each met or missed with its numbers: cpt > base, sft >= cpt, rl > sft, and the
  exported model > the retrieval baseline on unseen targets. A ">" is met only when the paired interval's low
  end is above 0 (the gain is measurable); a ">=" when its high end is at or above 0 (the targets do not show
  it worse).
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import load_config, parse_override
from pipeline.errors import UserFixableError
from pipeline.evaluation.comparison import Comparison, EvaluatedTargets
from pipeline.evaluation.intervals import Interval, change_words, paired_by_key

SIMULACRA = [sys.executable, "-m", "pipeline.cli"]
PREPARATION = ("ingest", "filter", "score", "split")
TRAINING = ("cpt", "sft", "rl")
# The public trajectories (their README: real runs of other projects), read where they lie, never copied.
PUBLIC = REPO.parent / "shared" / "data" / "public"
PUBLIC_PATHS = ("agentbench_alfworld", "react_alfworld", "mini_swe_agent")
# 39 + 51 + 10 = 100 targets: at least 100 (issue 28), each folder its share (the module docstring says why
# SWE-agent's demonstrations are not among them by default).
ITEMS_PER_PATH = 51
# (section, field, factor): the demo's budgets scaled to a run long enough for each stage to move the scores.
BUDGETS = (
    # cpt.max_steps: the demo's 32 steps (x1); 64 steps of one row moved the validation score 43.9 -> 43.4 (2026-12-03,
    # docs/performance.md). Two rows a step, the same 32 steps: the demo's 57 validation targets scored 46.6 / 45.4 /
    # 43.4 at seeds 0 / 1 / 2 against one row's 46.0 / 34.9 / 42.1: the seeds within 3.2 points where one row's spread
    # over 11.1 (2026-12-06, the rule written before the third seed: a mean 2 points above and a lowest seed not below
    # one row's). The step costs twice the time: `make learn` took 81 of its 90 minutes on a Zen 1 host (no bf16).
    ("cpt", "tokens_per_step", 2),
    ("sft", "max_queries", 3),
    ("sft", "max_steps", 3),
    ("rl", "max_steps", 6),
    ("rl", "max_prompts", 3),
    # One pass over each rollout batch (num_iterations 1): GSPO's clip never binds, the learning rate is the step
    # size. Chosen on the validation pool (2026-12-03, from the same SFT checkpoint, 12 steps of 4 prompts, by a rule
    # fixed beforehand): 3e-5 moved it 49.1 -> 52.7, 1e-5 -> 51.4.
    ("rl", "learning_rate", 3),
)
# Settings the demo makes for its 15 minutes that `make learn` does not: CPT's arithmetic is the model's (float32 on a
# CPU), as in the runs that chose the budgets above, where the demo's CPT runs under bf16 autocast on a CPU with
# bfloat16 instructions.
UNSET = ("cpt.mixed_precision",)
# Values it keeps whatever the demo's: RL's groups of 4 completions, as in the runs that chose RL's budget (the demo
# trains groups of 2 for its 15 minutes), a CPT checkpoint every 4 of its 32 float32 steps, about a minute of them
# to lose to a kill (the demo's faster steps save every 16), and validation answers of up to 200 tokens: the p95 of
# its 32 targets' observations is 162, where the demo's 24 need 84 and it caps them at 128.
FIXED = (
    ("rl.num_generations", "4"),
    ("rl.per_device_batch_size", "4"),
    ("cpt.save_steps", "4"),
    ("validation.max_tokens", "200"),
)
# Validation targets: 32 of the demo's 57 (the demo asks 24), intervals of about +-5 points on a stage's change.
VALIDATION_TARGETS = 32
# RL's prompts (groups) an optimizer step: TRL's gradient_accumulation_steps, generated at once. rl.max_steps x6
# counts groups, so these make 48 groups 12 steps of 4. Chosen on the validation pool (2026-12-03, from 94da898's
# SFT checkpoint, by a rule fixed beforehand): 12 steps of 4 prompts moved it +2.3 [+0.4, +4.7], 48 steps of one
# -2.1 [-6.0, +1.7], 24 of one -3.1 [-6.8, +0.4]: each update the mean of 4 prompts', not one prompt's.
RL_PROMPTS_PER_STEP = 4
# The overall row's columns: the judge's score (0-100), teacher-forced CE of the real observation (nats a
# token, lower is better), semantic and exact match rates, the share of answers that parsed in the format.
METRICS = ("score", "observation_ce", "semantic_match", "exact_match", "parse_rate")
LOWER_IS_BETTER = {"observation_ce"}
BASE, BASELINE = "base", "baseline"  # the `stage` of the base model's and the retrieval baseline's rows
EXPORTED = "exported"  # stands for the stage of the checkpoint `simulacra export` shipped
# Each stage against the one it started from, on every target's score.
GAINS = (("cpt", BASE), ("sft", "cpt"), ("rl", "sft"))
# Issue 28's targets: (model, compared with, relation); see the module's docstring for when one is met.
TARGETS = (("cpt", BASE, ">"), ("sft", "cpt", ">="), ("rl", "sft", ">"), (EXPORTED, BASELINE, ">"))


def public_data() -> list[str]:
    """The default `--data`: the public folders, or a one-line error where they are not beside the repository."""
    missing = [name for name in PUBLIC_PATHS if not (PUBLIC / name).is_dir()]
    if missing:
        raise SystemExit(
            f"bench/learning.py: no public trajectories at {PUBLIC} (missing {', '.join(missing)}): "
            "put the shared data beside the repository, or give --data FILE..."
        )
    return [str(PUBLIC / name) for name in PUBLIC_PATHS]


def scaled_budgets(config_path: Path, given: list[str]) -> list[str]:
    """`--set` overrides of the scaled budgets, for the fields the user did not set."""
    config = load_config(config_path)
    fields_given = _fields(given)
    overrides = []
    for section, field, factor in BUDGETS:
        value = getattr(getattr(config, section), field)
        if f"{section}.{field}" not in fields_given and value is not None:  # None: all of the pool already
            if (section, field) == ("rl", "max_steps") and "rl.gradient_accumulation_steps" not in fields_given:
                value = max(1, value * factor // RL_PROMPTS_PER_STEP)  # the same groups, RL_PROMPTS_PER_STEP a step
                factor = 1
            # %g: 3e-05, not 3.0000000000000004e-05, so that a run's fingerprint is the one a `--set` of it gives.
            overrides.append(f"{section}.{field}={value * factor:g}")
    overrides += [f"{field}=null" for field in UNSET if field not in fields_given]
    overrides += [f"{field}={value}" for field, value in FIXED if field not in fields_given]
    if "rl.gradient_accumulation_steps" not in fields_given:
        overrides.append(f"rl.gradient_accumulation_steps={RL_PROMPTS_PER_STEP}")
        if "rl.steps_per_generation" not in fields_given:
            overrides.append(f"rl.steps_per_generation={RL_PROMPTS_PER_STEP}")
    return overrides


def _fields(overrides: list[str]) -> set[str]:
    return {text.split("=", 1)[0].strip() for text in overrides}


def bench_overrides(config_path: Path, workspace: Path, given: list[str]) -> list[str]:
    overrides = [f"workspace.path={workspace}", *scaled_budgets(config_path, given)]
    config = load_config(config_path, [parse_override(text) for text in given])
    fields_given = _fields(given)
    if (
        config.evaluate.benchmark.max_history_chars is None
        and "evaluate.benchmark.max_history_chars" not in fields_given
    ):
        overrides.append(f"evaluate.benchmark.max_history_chars={config.evaluate.max_history_chars}")
    if (
        config.evaluate.benchmark.max_items_per_path is None
        and "evaluate.benchmark.max_items_per_path" not in fields_given
    ):
        overrides.append(f"evaluate.benchmark.max_items_per_path={ITEMS_PER_PATH}")
    if "validation.max_queries" not in fields_given:
        # The stages' before/after and the export's choice on VALIDATION_TARGETS, however few the demo's 15 minutes hold.
        overrides.append(f"validation.max_queries={VALIDATION_TARGETS}")
    if "evaluate.checkpoints" not in fields_given:
        # Each stage's gain over the one it started from needs every stage's checkpoint evaluated (the demo
        # evaluates only the shipped one, to fit its 15 minutes).
        overrides.append("evaluate.checkpoints=newest")
    return overrides + given  # the user's last: a field they set is theirs


def answer_budget(config_path: Path, overrides: list[str], data: list[str]) -> list[str]:
    """`evaluate.predictor.max_tokens` raised to the p95 of the benchmark targets' observations in the base
    model's tokenizer, which `simulacra evaluate` requires (stages/evaluate.py `_check_budget`); nothing when
    the config's holds it or `--set` gave one. Run after cpt: the base model's folder exists by then."""
    if "evaluate.predictor.max_tokens" in _fields(overrides):
        return []
    from pipeline.evaluation.benchmark import read_benchmark
    from pipeline.training.budgets import answer_tokens, percentile_95
    from pipeline.training.models import base_model_ref, load_tokenizer

    config = load_config(config_path, [parse_override(text) for text in overrides])
    benchmark = config.evaluate.benchmark
    items = read_benchmark(
        data, benchmark.target_field, benchmark.max_history_chars, benchmark.max_items_per_path, config.evaluate.seed
    ).items
    tokenizer = load_tokenizer(base_model_ref(config), config.model.trust_remote_code)
    needed = percentile_95(answer_tokens(tokenizer, [item.query.reference for item in items]))
    return [f"evaluate.predictor.max_tokens={needed}"] if needed > config.evaluate.predictor.max_tokens else []


def run_stage(config_path: Path, overrides: list[str], command: list[str]) -> float:
    """One `simulacra` command, its output on the terminal; its wall seconds. A failure ends the bench with its status."""
    options = [arg for text in overrides for arg in ("--set", text)]
    print(f"\n== simulacra {' '.join(command)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run([*SIMULACRA, "--config", str(config_path), *options, *command], cwd=REPO)
    if done.returncode != 0:
        print(
            f"bench/learning.py: `simulacra {command[0]}` exited {done.returncode}; rerun the same command to "
            "continue (every stage resumes)",
            file=sys.stderr,
        )
        sys.exit(done.returncode)
    return time.perf_counter() - start


def newest_report(workspace: Path, since: float) -> Path:
    """The report `simulacra evaluate` just wrote (runs/evaluate/<digest>/report.json)."""
    reports = [
        path for path in (workspace / "runs" / "evaluate").glob("*/report.json") if path.stat().st_mtime >= since
    ]
    if not reports:
        raise SystemExit("bench/learning.py: `simulacra evaluate` wrote no report.json")
    return max(reports, key=lambda path: path.stat().st_mtime)


def relative(value: float | None, reference: float | None) -> dict[str, float | None]:
    """Difference and ratio to a reference row's value (None where either is missing or the ratio undefined)."""
    if value is None or reference is None:
        return {"difference": None, "ratio": None}
    return {"difference": value - reference, "ratio": value / reference if reference else None}


def comparison(overall: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, each metric against the base model's and the retrieval baseline's, measured in this run."""
    by_stage = {row["stage"]: row for row in overall}
    result = []
    for row in overall:
        entry: dict[str, Any] = {"model": row["model"], "stage": row["stage"]}
        for reference in (BASE, BASELINE):
            other = by_stage.get(reference)
            entry[f"vs_{reference}"] = {metric: relative(row[metric], other and other[metric]) for metric in METRICS}
        result.append(entry)
    return result


# -- what the stages taught ------------------------------------------------------------------------
def paired(evaluated: list[EvaluatedTargets], stage: str, other: str, measure: str, relation: str) -> Comparison | None:
    """`stage`'s model against `other`'s on `measure`, paired over the targets both scored (None if either is missing)."""
    by_stage = {targets.stage: targets for targets in evaluated}
    model, reference = by_stage.get(stage), by_stage.get(other)
    if model is None or reference is None:
        return None
    difference = paired_by_key(model.of(measure, "all"), reference.of(measure, "all"))
    return Comparison(model.model, reference.model, relation, "all", measure, difference, False)


def gains(evaluated: list[EvaluatedTargets], exported: str | None) -> dict[str, Comparison]:
    """Each stage over the one it started from (the score on every target), and the exported model's stage
    over the base model and the retrieval baseline on the targets not seen in training; keyed `model vs other`."""
    wanted = [(f"{stage} vs {other}", stage, other, "score", "started from") for stage, other in GAINS]
    if exported is not None:
        wanted += [
            (f"{EXPORTED} vs {BASE}", exported, BASE, "score_unseen", "base"),
            (f"{EXPORTED} vs {BASELINE}", exported, BASELINE, "score_unseen", "retrieval baseline"),
        ]
    found = {}
    for name, stage, other, measure, relation in wanted:
        compared = paired(evaluated, stage, other, measure, relation)
        if compared is not None:
            found[name] = compared
    return found


def target_met(difference: Interval, relation: str) -> bool:
    """`>`: the interval's low end above 0; `>=`: its high end at or above 0."""
    bound = difference.low if relation == ">" else difference.high
    return bound is not None and (bound > 0 if relation == ">" else bound >= 0)


def targets(found: dict[str, Comparison]) -> list[dict[str, Any]]:
    """Issue 28's targets, each met or missed (or not measured, where a model is missing) with its numbers."""
    rows = []
    for stage, other, relation in TARGETS:
        compared = found.get(f"{stage} vs {other}")
        name = f"{stage} {relation} {'retrieval baseline' if other == BASELINE else other}"
        if compared is None:
            rows.append({"target": name, "verdict": "not measured", "difference": None, "low": None, "high": None})
            continue
        verdict = "met" if target_met(compared.difference, relation) else "missed"
        rows.append(
            {
                "target": name,
                "verdict": verdict,
                "model": compared.model,
                "compared_with": compared.compared_with,
                "measure": compared.measure,
                "difference": compared.difference.mean,
                "low": compared.difference.low,
                "high": compared.difference.high,
                "targets": compared.difference.n,
                "change": compared.change,
            }
        )
    return rows


def run_metrics(checkpoint_path: str | None) -> dict[str, Any]:
    """The metrics.json of the training run whose model folder is `checkpoint_path` ({} when there is none)."""
    path = Path(checkpoint_path).parent / "metrics.json" if checkpoint_path else None
    return json.loads(path.read_text()) if path is not None and path.is_file() else {}


def validation_words(metrics: dict[str, Any]) -> str:
    from pipeline.training.validation import summary_words

    return summary_words(metrics) or "no validation score"


def prompt_reward_words(metrics: dict[str, Any]) -> str:
    if metrics.get("prompt_reward_after") is None:
        return "no reward on its prompts"
    change = Interval(
        metrics["prompt_reward_change"],
        metrics["prompt_reward_change_low"],
        metrics["prompt_reward_change_high"],
        metrics["prompt_reward_prompts"],
    )
    return (
        f"reward on its {metrics['prompt_reward_prompts']} prompts (greedy, 0-25) {metrics['prompt_reward_before']:.2f} "
        f"-> {metrics['prompt_reward_after']:.2f}, {change_words(change, digits=2)}"
    )


def read_workspace(config_path: Path, overrides: list[str], evaluation_ids: list[str]):
    """From the bench's store, once every command has finished: the evaluations' per-target values, each
    checkpoint's folder by id, and the metrics of the newest export."""
    from pipeline.evaluation.comparison import evaluated_targets
    from pipeline.store.database import Store

    config = load_config(config_path, [parse_override(text) for text in overrides])
    with Store(config.workspace.database_path, read_only=True) as store:
        evaluated = evaluated_targets(store, evaluation_ids)
        folders = {
            row["checkpoint_id"]: row["path"] for row in store.rows("SELECT checkpoint_id, path FROM checkpoints")
        }
        exported = store.rows("SELECT metrics FROM checkpoints WHERE stage = 'export' ORDER BY created_at DESC LIMIT 1")
    export = exported[0]["metrics"] if exported else None
    return evaluated, folders, json.loads(export) if isinstance(export, str) else (export or {})


# -- printing ---------------------------------------------------------------------------------------
def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _against(pair: dict[str, float | None], digits: int) -> str:
    if pair["difference"] is None:
        return "-"
    ratio = "" if pair["ratio"] is None else f" ({pair['ratio']:.2f}x)"
    return f"{pair['difference']:+.{digits}f}{ratio}"


def _print_table(title: str, header: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(cell) for cell in column) for column in zip(header, *lines)]
    print(f"\n{title}")
    for cells in [header, ["-" * width for width in widths], *lines]:
        print("  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip())


def print_tables(overall: list[dict[str, Any]], compared: list[dict[str, Any]], report: dict[str, Any]) -> None:
    digits = {"score": 1}
    _print_table(
        f"Overall, {report['eval_set']}; judge: {report['judge_caption']}",
        ["model", "queries", *METRICS],
        [[row["model"], str(row["queries"]), *(_number(row[m], digits.get(m, 3)) for m in METRICS)] for row in overall],
    )
    for reference, name in ((BASE, "the base model"), (BASELINE, "the retrieval baseline")):
        lower = ", ".join(sorted(LOWER_IS_BETTER))
        _print_table(
            f"Against {name}, same run: difference (ratio); {lower}: lower is better",
            ["model", *METRICS],
            [
                [entry["model"], *(_against(entry[f"vs_{reference}"][m], digits.get(m, 3)) for m in METRICS)]
                for entry in compared
            ],
        )


def print_learning(
    found: dict[str, Comparison],
    validation: dict[str, str],
    export: dict[str, Any],
    rl: dict[str, Any],
    met: list[dict[str, Any]],
) -> None:
    print(
        "\nEach stage over the one it started from: the score (0-100) on the public targets, paired, 95% interval; "
        "beside it, the stage's own validation change"
    )
    for stage, other in GAINS:
        compared = found.get(f"{stage} vs {other}")
        print(
            f"  {compared.words if compared else f'{stage} vs {other}: not evaluated'}  |  {validation.get(stage, '-')}"
        )
    if export:
        print(
            f"\nExported: {export.get('source_checkpoint')} ({export.get('source_stage')}), {export.get('chosen_by')}"
        )
        for other in (BASE, BASELINE):
            compared = found.get(f"{EXPORTED} vs {other}")
            print(
                f"  on the targets not seen in training: {compared.words if compared else f'no {other} row to compare with'}"
            )
    print(f"\nRL: reward curve {rl.get('rewards_png') or '(no rewards.png)'}; {rl['prompt_reward']}")
    print("\nTargets (issue 28; `>`: the interval's low end above 0, `>=`: its high end at or above 0):")
    for row in met:
        print(f"  {row['target']}: {row['verdict']}" + (f", {row['change']}" if row.get("change") else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data",
        nargs="+",
        help=f"Benchmark files or folders every model is scored on (default: "
        f"{', '.join(PUBLIC_PATHS)} under {PUBLIC}).",
    )
    parser.add_argument(
        "--workspace",
        type=Path,
        default=Path("bench-workspace/learning"),
        help="The bench's own workspace (relative to the repository root); never the demo's.",
    )
    parser.add_argument(
        "--config", type=Path, default=Path("data/configs/demo.yaml"), help="The config whose budgets are scaled."
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Override one field, as `simulacra --set` (repeatable); a budget set here is not scaled.",
    )
    args = parser.parse_args()
    config_path = args.config if args.config.is_absolute() else REPO / args.config
    workspace = (args.workspace if args.workspace.is_absolute() else REPO / args.workspace).resolve()
    data = [str(Path(name).expanduser().resolve()) for name in args.data] if args.data else public_data()
    try:
        overrides = bench_overrides(config_path, workspace, args.overrides)
    except UserFixableError as exc:
        print(f"bench/learning.py: {exc}", file=sys.stderr)
        return 2
    print("overrides: " + " ".join(overrides), flush=True)

    seconds = {stage: run_stage(config_path, overrides, [stage]) for stage in (*PREPARATION, *TRAINING)}
    try:
        budget = answer_budget(config_path, overrides, data)
    except UserFixableError as exc:  # a --data path that is not there, say
        print(f"bench/learning.py: {exc}", file=sys.stderr)
        return 2
    if budget:
        print(f"\nfor the benchmark's p95 observation: {budget[0]}", flush=True)
    overrides += budget
    started = time.time()
    seconds["evaluate"] = run_stage(
        config_path, overrides, ["evaluate", *(arg for name in data for arg in ("--data", name))]
    )
    report_path = newest_report(workspace, started)
    seconds["export"] = run_stage(config_path, overrides, ["export"])
    report = json.loads(report_path.read_text())
    evaluated, folders, export = read_workspace(config_path, overrides, report["evaluations"])

    overall = [row for row in report["table"] if row["domain"] == "all"]
    by_stage = {row["stage"]: row for row in overall}
    exported = next((row["stage"] for row in overall if row["checkpoint_id"] == export.get("source_checkpoint")), None)
    found = gains(evaluated, exported)
    runs = {
        stage: run_metrics(folders.get(by_stage[stage]["checkpoint_id"])) for stage in TRAINING if stage in by_stage
    }
    validation = {stage: validation_words(metrics) for stage, metrics in runs.items()}
    rl = runs.get("rl", {})
    rewards_png = None
    if rl.get("reward_plot") and Path(rl["reward_plot"]).is_file():
        rewards_png = workspace.with_suffix(".rewards.png")
        shutil.copyfile(rl["reward_plot"], rewards_png)
    rl_summary = {
        "rewards_png": str(rewards_png) if rewards_png else None,
        "prompt_reward": prompt_reward_words(rl),
        **{key: value for key, value in rl.items() if key.startswith("prompt_reward")},
    }
    met = targets(found)

    compared = comparison(overall)
    print_tables(overall, compared, report)
    print_learning(found, validation, export, rl_summary, met)
    print(
        "\nwall seconds: "
        + ", ".join(f"{stage} {value:.0f}" for stage, value in seconds.items())
        + f"; total {sum(seconds.values()):.0f}"
    )
    result_path = workspace.with_suffix(".json")
    result_path.write_text(
        json.dumps(
            {
                "config": str(config_path),
                "overrides": overrides,
                "data": data,
                "wall_seconds": seconds,
                "eval_set": report["eval_set"],
                "judge": report["judge_caption"],
                "report": str(report_path),
                "overall": [
                    {key: row[key] for key in ("model", "stage", "queries", "checkpoint_id", *METRICS)}
                    for row in overall
                ],
                "against": compared,
                "gains": {name: c.row() for name, c in found.items()},
                "validation": {
                    stage: {key: value for key, value in metrics.items() if key.startswith("val_")}
                    for stage, metrics in runs.items()
                },
                "export": {
                    key: export.get(key) for key in ("source_checkpoint", "source_stage", "chosen_by", "choice")
                },
                "rl": rl_summary,
                "targets": met,
                "table": report["table"],
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    print(f"results: {result_path}; evaluation report: {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
