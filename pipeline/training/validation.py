"""The validation score: what every training stage reports before and after, and what `export` ships by (issue 28).

The validation pool (stages/split.py) is carved from the training side and never trained on. Each
training stage (cpt, sft, rl) asks one seeded set of its target turns (`validation.max_queries`, the
same set for every stage) to the model it starts from and to the model it trained, greedily, each in
the answer format it was trained in (pipeline/prompts/answer_format.py), and scores every answer
against the real observation with `validation.judge` on evaluation's 0-100 scale. An answer not in its
format is scored as the empty observation, as evaluation scores it; a failed generation is left out.

The stage's metrics then carry both means with their bootstrap intervals and the paired difference
(pipeline/evaluation/intervals.py), and its summary line says in words whether the stage made the
model better, worse, or changed nothing measurable. Since every stage scores the same targets the
same way, `export` compares the checkpoints' scores directly, and the eval pool stays for reporting.

Where it runs: in `train`, on the main process, from files only (a GPU worker included): the answers
and the scores are written to the run's folder before the run's completion marker, so a resumed run
neither asks nor judges again. The answers are also kept by model, format and targets in
`<runs>/validation/`, so the next stage's "before" (the previous stage's "after") is read, not asked
again. An LLM judge caches its answers in a scratch DuckDB file of the run's folder, never the store.
"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.evaluation.intervals import bootstrap_mean, change_words, paired_by_key
from pipeline.prompts.answer_format import AnswerFormat, answer_format
from pipeline.sft.queries import Query, chat_messages, choose_targets, distinct_queries, load_queries
from pipeline.store.atomic_files import write_text_atomic

POOL = "val"
TARGETS_FILE = "validation_targets.json"
SHARED_DIR = "validation"  # under the workspace's runs folder: answers by model, format and targets
SCRATCH_CACHE = "validation_cache.duckdb"
METRICS_FILE = "validation.json"  # the stage's validation metrics, written once
SCORES_FILE = "validation_scores.json"  # per target: the trained model's score (export's paired comparisons)
NOT_ANSWERED = ("generation_failed",)


def choose(store, config, snapshot_dir: Path) -> list[tuple[str, int]]:
    """The seeded validation targets, the same for every stage of one split: `max_queries` distinct
    queries (pipeline/sft/queries.py `distinct_queries`), a repeat's place taken by the next in rank."""
    from pipeline.store.snapshot import target_turns

    validation = config.validation
    if not validation.max_queries:
        return []
    ranked = choose_targets(target_turns(store, POOL), None, validation.seed)
    queries, _ = distinct_queries(snapshot_dir, POOL, ranked, validation.max_queries, validation.max_history_chars)
    return [(query.trajectory_id, query.turn_index) for query in queries]


def write_targets(output_dir: Path, targets: Sequence[tuple[str, int]]) -> None:
    write_text_atomic(output_dir / TARGETS_FILE, json.dumps([list(t) for t in targets]) + "\n")


def read_queries(config, output_dir: Path, snapshot_dir: Path) -> list[Query]:
    path = output_dir / TARGETS_FILE
    if not path.is_file():
        return []
    chosen = [tuple(target) for target in json.loads(path.read_text())]
    return load_queries(snapshot_dir, POOL, chosen, config.validation.max_history_chars) if chosen else []


def check_budget(config, tokenizer, queries: Sequence[Query], thinking_tokens: int) -> None:
    """`validation.max_tokens` must hold the p95 observation (and the thinking a thinking model writes)."""
    from pipeline.training.budgets import answer_tokens, percentile_95, require_budget

    if queries:
        what = "the validation observations" + (" plus the thinking SFT taught" if thinking_tokens else "")
        require_budget(
            "validation.max_tokens",
            config.validation.max_tokens,
            percentile_95(answer_tokens(tokenizer, [q.reference for q in queries])) + thinking_tokens,
            what,
        )


def _key(model_ref: str, fmt: AnswerFormat, queries: Sequence[Query], config) -> str:
    from pipeline.training.models import model_identity

    shown = [(q.query_id, [(t.action, t.observation) for t in q.history], q.action) for q in queries]
    payload = json.dumps([model_identity(str(model_ref)), fmt.name, config.validation.max_tokens, shown])
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _path(output_dir: Path, name: str) -> Path:
    return output_dir / f"validation_{name}.json"


# Rows a pass decodes together: every target at once up to this many, so targets of one environment prefill
# its system prompt once (pipeline/llm/batching.py `prefix_families`) and a decoding step, which reads every
# weight whatever its rows, serves them all.
PASS_ROWS = 32


def pass_rows(requests: int) -> int:
    return max(1, min(PASS_ROWS, requests))


def predict(config, queries: Sequence[Query], model_ref: str, fmt: AnswerFormat, output_dir: Path, name: str) -> None:
    """The greedy answers of `model_ref` in `fmt`, written once to the run's folder as `validation_<name>.json`
    (a resumed run does not ask again), and kept by model, format and targets for the next stage."""
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import ChatRequest, open_client
    from pipeline.store.database import Store

    path = _path(output_dir, name)
    if path.is_file() or not queries:
        return
    shared = Path(config.workspace.runs_dir) / SHARED_DIR / f"{_key(model_ref, fmt, queries, config)}.json"
    if shared.is_file():
        answers = json.loads(shared.read_text())
    else:
        endpoint = EndpointConfig(
            backend="transformers",
            model=str(model_ref),
            temperature=0.0,
            max_tokens=config.validation.max_tokens,
            batch_size=pass_rows(len(queries)),
        )
        requests = [ChatRequest(chat_messages(q, fmt.system_prompt(q.domain, q.system))) for q in queries]
        with Store(output_dir / SCRATCH_CACHE) as scratch:
            client = open_client(endpoint, scratch, f"validation.{name}")
            generated = client.complete_sync(requests)
        answers = [{"query_id": q.query_id, "text": a.text, "error": a.error} for q, a in zip(queries, generated)]
        shared.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(shared, json.dumps(answers) + "\n")
    write_text_atomic(
        path, json.dumps({"format": fmt.name, "model": str(model_ref), "answers": answers}, indent=2) + "\n"
    )


def score(queries: Sequence[Query], output_dir: Path, name: str, judge) -> dict[str, dict[str, Any]]:
    """Per query id: the answer's parse status and its score (0-100; None for a failed generation or an
    invalid judgement, which are the endpoint's and the judge's failures, not the model's)."""
    from pipeline.sft.judging import PointwiseItem

    path = _path(output_dir, name)
    if not queries or not path.is_file():
        return {}
    recorded = json.loads(path.read_text())
    fmt = answer_format(recorded["format"])
    parsed = [fmt.parse(answer["text"]) for answer in recorded["answers"]]
    answered = [i for i, p in enumerate(parsed) if p.status not in NOT_ANSWERED]
    # Not in its format: scored as the empty observation, as evaluation scores it (its parse rate says why).
    verdicts = judge.pointwise(
        [PointwiseItem(queries[i], parsed[i].prediction if parsed[i].ok else "") for i in answered]  # type: ignore[arg-type]  # ok: a prediction
    )
    rows = {q.query_id: {"status": p.status, "score": None} for q, p in zip(queries, parsed)}
    for i, verdict in zip(answered, verdicts):
        rows[queries[i].query_id]["score"] = (verdict.score - 1.0) / 4.0 * 100.0 if verdict.valid else None
    return rows


def metrics(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], judge_label: str) -> dict[str, Any]:
    """The stage's validation metrics: both means with their intervals, the paired change, the parse rates."""
    if not after:
        return {}
    result: dict[str, Any] = {"val_queries": len(after), "val_judge": judge_label}
    for name, rows in (("before", before), ("after", after)):
        interval = bootstrap_mean([row["score"] for row in rows.values()])
        answered = [row for row in rows.values() if row["status"] not in NOT_ANSWERED]
        result.update(
            {
                f"val_score_{name}": interval.mean,
                f"val_score_{name}_low": interval.low,
                f"val_score_{name}_high": interval.high,
                f"val_parse_rate_{name}": (
                    sum(r["status"] == "ok" for r in answered) / len(answered) if answered else None
                ),
            }
        )
    change = paired_by_key({k: r["score"] for k, r in after.items()}, {k: r["score"] for k, r in before.items()})
    result.update(
        {
            "val_change": change.mean,
            "val_change_low": change.low,
            "val_change_high": change.high,
            "val_verdict": change.direction,
        }
    )
    return result


def summary_words(measured: dict[str, Any]) -> str:
    """`validation score 34.8 -> 41.1, improved +6.3 [+1.2, +11.0] (32 targets)`, for a summary line."""
    if measured.get("val_score_after") is None:
        return ""
    from pipeline.evaluation.intervals import Interval

    change = Interval(
        measured["val_change"], measured["val_change_low"], measured["val_change_high"], measured["val_queries"]
    )
    before = "-" if measured.get("val_score_before") is None else f"{measured['val_score_before']:.1f}"
    return (
        f"validation score {before} -> {measured['val_score_after']:.1f}, {change_words(change)} "
        f"({measured['val_queries']} targets, answers in format {_rate(measured.get('val_parse_rate_after'))})"
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def measure(
    config,
    queries: Sequence[Query],
    output_dir: Path,
    before: tuple[str, AnswerFormat],
    after: tuple[str, AnswerFormat],
) -> dict[str, Any]:
    """The stage's validation metrics: `before` and `after` are (model, format). Computed once per run
    folder (written last, so a kill repeats at most the judging); {} when there is no validation target."""
    from pipeline.sft.generators import build_judge, judge_label
    from pipeline.store.database import Store

    path = output_dir / METRICS_FILE
    if path.is_file():
        return json.loads(path.read_text())
    if not queries:
        return {}
    predict(config, queries, before[0], before[1], output_dir, "before")
    predict(config, queries, after[0], after[1], output_dir, "after")
    with Store(output_dir / SCRATCH_CACHE) as scratch:
        judge, client = build_judge(config.validation.judge, scratch)
        rows = {name: score(queries, output_dir, name, judge) for name in ("before", "after")}
        if client is not None:
            client.check_failures()
    measured = {
        **metrics(rows["before"], rows["after"], judge_label(config.validation.judge)),
        "val_format_before": before[1].name,
        "val_format_after": after[1].name,
    }
    write_text_atomic(output_dir / SCORES_FILE, json.dumps(rows, indent=2, sort_keys=True) + "\n")
    write_text_atomic(path, json.dumps(measured, indent=2, sort_keys=True) + "\n")
    return measured


def target_scores(run_dir: Path, name: str = "after") -> dict[str, float | None]:
    """Per target, the score of a run's model (`after`) or of its starting model (`before`); {} if unmeasured."""
    path = Path(run_dir) / SCORES_FILE
    if not path.is_file():
        return {}
    return {query_id: row["score"] for query_id, row in json.loads(path.read_text())[name].items()}
