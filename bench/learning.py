"""What each training stage teaches: base -> cpt -> sft -> rl on the demo's pools, every checkpoint scored on the same files.

    .venv/bin/python bench/learning.py --data FILE... [--workspace bench-workspace/learning]
        [--config data/configs/demo.yaml] [--set KEY=VALUE ...]

Runs the pipeline's own commands (`simulacra ingest`, `filter`, `score`, `split`, `cpt`, `sft`, `rl`, each a
subprocess, as a user runs them) in a workspace of its own, never the demo's, with training budgets larger
than the config's, then `simulacra evaluate --data FILE...`: the base model, the newest cpt, sft and rl
checkpoints and the retrieval baseline, on the given files (simulacra-jsonl or any format ingest reads; their
target turns as given, pipeline/evaluation/benchmark.py). Every stage is resumable, so a rerun after a kill
continues where it stopped, and a rerun after a finished one only evaluates again (reused, not recomputed).

Budgets, read from the config and scaled so the bench follows the demo (the demo keeps each stage near a
minute; these aim at 30-60 minutes in all on 2 cores with SmolLM2-135M-Instruct):
  cpt.max_steps x4, sft.max_queries x3, sft.max_steps x3, rl.max_steps x3.
A `--set` of one of these fields is taken as given, not scaled (the smoke test's tiny budgets). The sft stage
checks its generators' `max_tokens` against the p95 of its queries' observations; since the queries that cannot
fit `sft.max_length` are passed over (the demo's tool calls), that p95 is 36-47 tokens for 24 to 80 queries,
well inside the demo's cap. (The measured run in the README predates that: its 40 queries held tool calls, whose
observations took the p95 to 304, so it gave the generators again with `max_tokens: 320`.)
Benchmark items get the history the checkpoints were trained on (`evaluate.max_history_chars`) unless
`--set evaluate.benchmark.max_history_chars=...` says otherwise: a whole history would overrun the
training window (demo: 2048 tokens) and score the truncation, not the stage.

The baselines, measured in the same run: every checkpoint's score is printed as a difference and a ratio
to the base model's (what training added) and to the retrieval baseline's (what a nearest-neighbour copy
of the cpt pool already gets). The table is printed at the end and written to `<workspace>.json`.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import load_config, parse_override  # noqa: E402
from pipeline.errors import UserFixableError  # noqa: E402

SIMULACRA = [sys.executable, "-m", "pipeline.cli"]
PREPARATION = ("ingest", "filter", "score", "split")
TRAINING = ("cpt", "sft", "rl")
# (section, field, factor): the demo's budgets scaled to a run long enough for each stage to move the scores.
BUDGETS = (("cpt", "max_steps", 4), ("sft", "max_queries", 3), ("sft", "max_steps", 3), ("rl", "max_steps", 3))
# The overall row's columns: the judge's score (0-100), teacher-forced CE of the real observation (nats a
# token, lower is better), semantic and exact match rates, the share of answers that parsed in the format.
METRICS = ("score", "observation_ce", "semantic_match", "exact_match", "parse_rate")
LOWER_IS_BETTER = {"observation_ce"}
BASE, BASELINE = "base", "baseline"  # the `stage` of the base model's and the retrieval baseline's rows


def scaled_budgets(config_path: Path, given: list[str]) -> list[str]:
    """`--set` overrides of the scaled budgets, for the fields the user did not set."""
    config = load_config(config_path)
    fields_given = {text.split("=", 1)[0].strip() for text in given}
    overrides = []
    for section, field, factor in BUDGETS:
        value = getattr(getattr(config, section), field)
        if f"{section}.{field}" not in fields_given and value is not None:  # None: all of the pool already
            overrides.append(f"{section}.{field}={value * factor}")
    return overrides


def bench_overrides(config_path: Path, workspace: Path, given: list[str]) -> list[str]:
    overrides = [f"workspace.path={workspace}", *scaled_budgets(config_path, given)]
    config = load_config(config_path, [parse_override(text) for text in given])
    if config.evaluate.benchmark.max_history_chars is None and not any(
        text.startswith("evaluate.benchmark.max_history_chars=") for text in given
    ):
        overrides.append(f"evaluate.benchmark.max_history_chars={config.evaluate.max_history_chars}")
    return overrides + given  # the user's last: a field they set is theirs


def run_stage(config_path: Path, overrides: list[str], command: list[str]) -> float:
    """One `simulacra` command, its output on the terminal; its wall seconds. A failure ends the bench with its status."""
    options = [arg for text in overrides for arg in ("--set", text)]
    print(f"\n== simulacra {' '.join(command)}", flush=True)
    start = time.perf_counter()
    done = subprocess.run([*SIMULACRA, "--config", str(config_path), *options, *command], cwd=REPO)
    if done.returncode != 0:
        print(f"bench/learning.py: `simulacra {command[0]}` exited {done.returncode}; rerun the same command to "
              "continue (every stage resumes)", file=sys.stderr)
        sys.exit(done.returncode)
    return time.perf_counter() - start


def newest_report(workspace: Path, since: float) -> Path:
    """The report `simulacra evaluate` just wrote (runs/evaluate/<digest>/report.json)."""
    reports = [path for path in (workspace / "runs" / "evaluate").glob("*/report.json") if path.stat().st_mtime >= since]
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
            [[entry["model"], *(_against(entry[f"vs_{reference}"][m], digits.get(m, 3)) for m in METRICS)]
             for entry in compared],
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", required=True, help="Benchmark files or folders every checkpoint is scored on.")
    parser.add_argument("--workspace", type=Path, default=Path("bench-workspace/learning"),
                        help="The bench's own workspace (relative to the repository root); never the demo's.")
    parser.add_argument("--config", type=Path, default=Path("data/configs/demo.yaml"), help="The config whose budgets are scaled.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="Override one field, as `simulacra --set` (repeatable); a budget set here is not scaled.")
    args = parser.parse_args()
    config_path = args.config if args.config.is_absolute() else REPO / args.config
    workspace = (args.workspace if args.workspace.is_absolute() else REPO / args.workspace).resolve()
    data = [str(Path(name).expanduser().resolve()) for name in args.data]
    try:
        overrides = bench_overrides(config_path, workspace, args.overrides)
    except UserFixableError as exc:
        print(f"bench/learning.py: {exc}", file=sys.stderr)
        return 2
    print("overrides: " + " ".join(overrides), flush=True)

    seconds = {stage: run_stage(config_path, overrides, [stage]) for stage in (*PREPARATION, *TRAINING)}
    started = time.time()
    seconds["evaluate"] = run_stage(config_path, overrides, ["evaluate", *(arg for name in data for arg in ("--data", name))])
    report_path = newest_report(workspace, started)
    report = json.loads(report_path.read_text())

    overall = [row for row in report["table"] if row["domain"] == "all"]
    compared = comparison(overall)
    print_tables(overall, compared, report)
    print("\nwall seconds: " + ", ".join(f"{stage} {value:.0f}" for stage, value in seconds.items())
          + f"; total {sum(seconds.values()):.0f}")
    result_path = workspace.with_suffix(".json")
    result_path.write_text(json.dumps(
        {"config": str(config_path), "overrides": overrides, "data": data, "wall_seconds": seconds,
         "eval_set": report["eval_set"], "judge": report["judge_caption"], "report": str(report_path),
         "overall": [{key: row[key] for key in ("model", "stage", "queries", "checkpoint_id", *METRICS)} for row in overall],
         "against": compared, "table": report["table"]},
        indent=2, default=str) + "\n")
    print(f"table: {result_path}; evaluation report: {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
