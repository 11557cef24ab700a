"""The evaluation table as other commands read it: `simulacra evaluate`, the model card of `simulacra export`.

`evaluation_rows(store, checkpoint_id)` finds the newest completed evaluation of a checkpoint and
returns the table it belongs to: every model evaluated on the same eval set with the same judge
(the base model, each stage's checkpoint, the retrieval baseline), one row per model and domain
plus one per model over all domains, each with the three fingerprints that key it. Scores are
AgentWorldBench's (raw - 1) / 4 x 100 of the judge's 1-5 scale; rates are fractions of the queries.
`parse_rate` is the share of answered queries (failed generations aside) whose answer parsed in the
model's format; `score_unseen` the score without the targets seen in training (`seen` of them).
Every mean carries its 95% bootstrap interval over targets and each row its paired comparisons
(pipeline/evaluation/comparison.py), so a card or a printed table never shows a bare number.
"""

from typing import Any

from pipeline.evaluation.comparison import INTERVAL_COLUMNS, digits, with_intervals

# Row order of the models: the pipeline's stages, then the baseline, then anything given by path.
# How an evaluation on the workspace's eval pool names its eval set (stages/evaluate.py).
EVAL_POOL = "eval pool"
STAGE_RANK = {"base": 0, "cpt": 1, "sft": 2, "rl": 3, "external": 4, "baseline": 5}

_SELECT = """SELECT e.evaluation_id, e.model, e.stage, r.domain, r.queries, r.judged, r.score, r.score_macro, r.domains,
       r.score_unseen, r.seen, r.parsed / nullif(r.queries - r.failed - r.empty, 0) AS parse_rate, r.format, r.factuality,
       r.consistency, r.realism, r.quality, r.observation_ce, r.perplexity, r.ce_rows, r.semantic_match, r.rouge_l,
       r.exact_match, r.exact, r.line_agreement, r.json_valid, r.unparsed, r.failed, r.empty, r.judge_invalid,
       e.judge, e.checkpoint_id, e.checkpoint_fingerprint, e.eval_set, e.eval_set_fingerprint, e.judge_fingerprint
    FROM evaluations e JOIN eval_results r USING (evaluation_id)
    WHERE e.completed"""


def _ordered(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (STAGE_RANK.get(r["stage"], 9), r["model"], r["domain"] == "all", r["domain"]))


def table_rows(store, evaluation_ids: list[str]) -> list[dict[str, Any]]:
    """The rows of the given evaluations (one table of `simulacra evaluate`)."""
    rows = store.rows(f"{_SELECT} AND e.evaluation_id IN (SELECT unnest(?::VARCHAR[]))", [evaluation_ids])
    return with_intervals(store, _ordered(rows))


def evaluation_rows(store, checkpoint_id: str) -> list[dict[str, Any]]:
    """The table of the newest completed evaluation of `checkpoint_id` (a `checkpoints.checkpoint_id`) on
    the eval pool (on `--data` files only when it has none): that checkpoint and every other model
    evaluated on the same eval set with the same judge (the newest evaluation of each), per domain and
    overall. Empty when it was never evaluated."""
    latest = store.rows(
        "SELECT eval_set_fingerprint, judge_fingerprint FROM evaluations WHERE completed AND checkpoint_id = ? "
        f"ORDER BY starts_with(eval_set, '{EVAL_POOL}') DESC, completed_at DESC LIMIT 1",
        [checkpoint_id],
    )
    if not latest:
        return []
    rows = store.rows(
        f"""{_SELECT} AND e.eval_set_fingerprint = ? AND e.judge_fingerprint = ?
            QUALIFY e.completed_at = max(e.completed_at) OVER (PARTITION BY e.checkpoint_id)""",
        [latest[0]["eval_set_fingerprint"], latest[0]["judge_fingerprint"]],
    )
    return with_intervals(store, _ordered(rows))


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value).replace("|", "\\|")


SUMMARY_COLUMNS = (
    "model",
    "domain",
    "queries",
    "score",
    "score_macro",
    "score_unseen",
    "seen",
    "judged",
    "empty",
    "parse_rate",
    "format",
    "factuality",
    "consistency",
    "realism",
    "quality",
    "observation_ce",
    "perplexity",
    "ce_rows",
    "semantic_match",
    "rouge_l",
    "exact_match",
    "exact",
    "line_agreement",
    "json_valid",
)
# The stage's table (the Prefect artifact, report.json): the summary's columns and their intervals.
TABLE_COLUMNS = (*SUMMARY_COLUMNS, "score_ci", *INTERVAL_COLUMNS)


def with_interval(row: dict[str, Any], column: str) -> str | None:
    """`41.1 [35.2, 47.0]` (a score) or `0.500 [0.333, 0.667]` (a rate, a CE): the row's value of `column`
    with its 95% interval; None where the column has none (a count, a name, a value missing)."""
    value, low, high = row.get(column), row.get(f"{column}_low"), row.get(f"{column}_high")
    if not isinstance(value, float) or low is None or high is None:
        return None
    places = digits(column)
    return f"{value:.{places}f} [{low:.{places}f}, {high:.{places}f}]"


def comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
    """`- cpt vs base (started from): score improved +6.3 [+1.2, +11.0]; ...`, one line per pair of models,
    overall (the `all` rows' comparisons)."""
    pairs: dict[tuple[str, str, str], list[str]] = {}
    for row in (row for row in rows if row["domain"] == "all"):
        for c in row.get("comparisons", []):
            changes = pairs.setdefault((c["model"], c["compared_with"], c["relation"]), [])
            changes.append(f"{c['measure']} {c['verdict']} {c['change']}")
    return [
        f"- {model} vs {other} ({relation}): {'; '.join(changes)}"
        for (model, other, relation), changes in pairs.items()
    ]


def markdown_table(rows: list[dict[str, Any]], columns: tuple[str, ...] = SUMMARY_COLUMNS) -> str:
    """A Markdown table of evaluation rows, with the judge and the fingerprints under it (a model card's
    section). Criteria show `-` for the similarity judge, which scores no criteria."""
    if not rows:
        return "No evaluation yet (`simulacra evaluate`)."
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(with_interval(row, c) or _cell(row[c]) for c in columns) + " |" for row in rows]
    first = rows[0]
    lines += [
        "",
        f"Judge: {judge_caption(first['judge'])} (`{first['judge_fingerprint']}`); eval set: {first['eval_set']} "
        f"(`{first['eval_set_fingerprint']}`). Scores are (raw - 1) / 4 x 100 of the judge's 1-5 scale; `score_unseen` "
        "leaves out the `seen` targets, whose (action, observation) is a turn of a training pool; `parse_rate` is "
        "the share of answers that parsed in the model's format (an unparsed one is scored as the empty observation). "
        "Each mean is followed by its 95% interval, a percentile bootstrap over the targets (observation CE's "
        "interval is of the mean per-target CE; its value is token-weighted).",
    ]
    models = {(row["model"], row["checkpoint_fingerprint"]) for row in rows}
    lines += [f"- {model}: fingerprint `{fingerprint}`" for model, fingerprint in sorted(models)]
    compared = comparison_lines(rows)
    if compared:
        lines += [
            "",
            "Paired comparisons, on the targets both models scored: the difference is model - the model compared "
            "with, its mean and 95% bootstrap interval over targets; `improved` or `WORSE` only where the interval "
            "excludes zero. Observation CE: lower is better, so a negative difference is an improvement.",
            "",
            *compared,
        ]
    return "\n".join(lines)


def judge_name(judge: str) -> str:
    """`similarity judge`, or `LLM judge <backend>:<model> prompt:<prompt>@<digest>`, from a judge's name
    (`evaluations.judge`; the digest is of its prompt and rubric files) or label."""
    return (
        "similarity judge" if judge.startswith("semantic") else f"LLM judge {judge.split('#')[0].removeprefix('llm:')}"
    )


def judge_caption(judge: str) -> str:
    if judge.startswith("semantic"):
        return (
            f"{judge_name(judge)} (content beyond the action, format, MiniLM; JSON leaf values) mapped onto the 1-5 "
            "scale, not a five-criteria judge"
        )
    return (
        f"{judge_name(judge)}, five criteria with the domain's rubric; scores compare only under this judge and prompt"
    )
