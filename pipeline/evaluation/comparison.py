"""The evaluation table's error bars and paired comparisons, from its per-target rows (issue 28, item 3).

Every number of the table (pipeline/evaluation/report.py) but the counts is a mean over target turns,
so each gets its 95% bootstrap interval over those targets (pipeline/evaluation/intervals.py), from the
rows of `eval_predictions` the aggregates are computed from, with the same rows left out: a generation
that failed, or an empty one when `evaluate.exclude_empty_generations` drops it, has no scores. A row
gains `<measure>_low` and `<measure>_high` and `<measure>_pm`, half the interval's width, the spread
lm-evaluation-harness prints as a stderr beside every metric.

Then every model is compared *paired*, on the targets both models scored, with:
- the model it started from: the nearest earlier stage of base -> cpt -> sft -> rl among the evaluated
  models (rl against sft, sft against cpt, cpt against base; `relation` "started from"; when that is base
  but the model did not start from it, as `evaluate.checkpoints: shipped` evaluates base and rl, "base");
- the base model, for the last trained stage when base is not the one it started from ("base");
- the retrieval baseline, for every model ("retrieval baseline").
A difference is always `model - compared_with`, per target, then its mean and interval: a positive
score or exact-match difference is better, a negative observation-CE difference is better (lower CE
is the better world model). Its verdict is "improved" or "WORSE" only when the interval excludes zero.
"""

from dataclasses import dataclass
from typing import Any

from pipeline.evaluation.intervals import (
    Interval,
    bootstrap_macro_mean,
    bootstrap_mean,
    paired_by_key,
    verdict,
)
from pipeline.evaluation.metrics import agentworldbench_sql
from pipeline.sft.judging import CRITERIA

# Rows without scores, left out of every mean as the aggregates leave them (stages/evaluate.py, UNSCORED).
UNSCORED = ("generation_failed", "empty_generation")
STAGE_ORDER = ("base", "cpt", "sft", "rl")
BASELINE_STAGE = "baseline"

# Each measure per target, as SQL over `eval_predictions`; its mean over the targets is the table's column.
# Observation CE is the exception: the table's value stays token-weighted (sum of ce_sum / sum of
# ce_tokens, perplexity's definition), while the interval is of the mean of per-target CEs, since the
# bootstrap resamples targets, not tokens. The two differ when long observations are easier or harder.
MEASURES = {
    "score": agentworldbench_sql("judge_raw"),
    "score_unseen": f"CASE WHEN NOT seen_in_training THEN {agentworldbench_sql('judge_raw')} END",
    **{name: agentworldbench_sql(name) for name in CRITERIA},
    "parse_rate": "(parse_status = 'ok')::INTEGER",
    "observation_ce": "ce_sum / nullif(ce_tokens, 0)",
    "semantic_match": "semantic_match::INTEGER",
    "rouge_l": "rouge_l",
    "exact_match": "exact_match::INTEGER",
    "exact": "exact::INTEGER",
    "line_agreement": "line_agreement",
    "json_valid": "json_valid::INTEGER",
}
# The macro mean over domains, on the `all` row: resampled within each domain (`bootstrap_macro_mean`).
MACRO = "score_macro"
# Measures on AgentWorldBench's 0-100 scale, shown with one decimal; rates and CE with three.
HUNDRED_SCALE = ("score", MACRO, "score_unseen", *CRITERIA)
INTERVAL_COLUMNS = tuple(f"{name}_{bound}" for name in (*MEASURES, MACRO) for bound in ("low", "high", "pm"))

# What two models are compared on: (measure, lower is better).
COMPARED = (("score", False), ("exact_match", False), ("observation_ce", True))


def digits(measure: str) -> int:
    return 1 if measure in HUNDRED_SCALE else 3


@dataclass(frozen=True, slots=True)
class EvaluatedTargets:
    """One evaluation's per-target values: {measure: {query_id: value}} per domain, and its domains."""

    evaluation_id: str
    model: str
    stage: str
    domains: dict[str, str]  # query_id -> domain
    values: dict[str, dict[str, float | None]]  # measure -> query_id -> value

    def of(self, measure: str, domain: str) -> dict[str, float | None]:
        """The measure's values on the domain's targets (`all`: every target)."""
        return {q: v for q, v in self.values[measure].items() if domain == "all" or self.domains[q] == domain}


@dataclass(frozen=True, slots=True)
class Comparison:
    """`model` against `compared_with` on one measure and domain, paired over the targets both scored."""

    model: str
    compared_with: str
    relation: str  # started from, base, retrieval baseline
    domain: str
    measure: str
    difference: Interval  # model - compared_with, per target
    lower_is_better: bool

    @property
    def verdict(self) -> str:
        return verdict(self.difference, self.lower_is_better)

    @property
    def change(self) -> str:
        """`+6.3 [+1.2, +11.0]`"""
        return self.difference.text(signed=True, digits=digits(self.measure))

    @property
    def words(self) -> str:
        """`sft vs cpt no measurable change +1.0 [-2.1, +4.3]`"""
        return f"{self.model} vs {self.compared_with} {self.verdict} {self.change}"

    def row(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "compared_with": self.compared_with,
            "relation": self.relation,
            "domain": self.domain,
            "measure": self.measure,
            "difference": self.difference.mean,
            "low": self.difference.low,
            "high": self.difference.high,
            "targets": self.difference.n,
            "verdict": self.verdict,
            "change": self.change,
            "comparison": f"{self.model} vs {self.compared_with} {self.change}",
        }


def evaluated_targets(store, evaluation_ids: list[str]) -> list[EvaluatedTargets]:
    """Every measure per target of the given evaluations, the unscored rows left out."""
    measures = ", ".join(f"{expression} AS {name}" for name, expression in MEASURES.items())
    rows = store.rows(
        f"""SELECT p.evaluation_id, e.model, e.stage, p.query_id, p.domain, {measures}
            FROM eval_predictions p JOIN evaluations e USING (evaluation_id)
            WHERE p.evaluation_id IN (SELECT unnest(?::VARCHAR[])) AND p.parse_status NOT IN {UNSCORED}
            ORDER BY p.evaluation_id, p.query_id""",
        [evaluation_ids],
    )
    found: dict[str, EvaluatedTargets] = {}
    for row in rows:
        targets = found.setdefault(
            row["evaluation_id"],
            EvaluatedTargets(row["evaluation_id"], row["model"], row["stage"], {}, {name: {} for name in MEASURES}),
        )
        targets.domains[row["query_id"]] = row["domain"]
        for name in MEASURES:
            targets.values[name][row["query_id"]] = row[name]
    return list(found.values())


def measure_intervals(targets: EvaluatedTargets, domain: str) -> dict[str, Interval]:
    """Each measure's interval on the domain's targets (`all`: every target, with the macro mean's)."""
    intervals = {name: bootstrap_mean(list(targets.of(name, domain).values())) for name in MEASURES}
    if domain == "all":
        domains = sorted(set(targets.domains.values()))
        intervals[MACRO] = bootstrap_macro_mean([list(targets.of("score", d).values()) for d in domains])
    return intervals


def interval_columns(intervals: dict[str, Interval]) -> dict[str, float | None]:
    """`<measure>_low`, `_high` and `_pm` for every measure; None where the row has no such interval."""
    columns: dict[str, float | None] = dict.fromkeys(INTERVAL_COLUMNS)
    for name, interval in intervals.items():
        columns.update({f"{name}_low": interval.low, f"{name}_high": interval.high, f"{name}_pm": interval.half_width})
    return columns


def pairs(evaluated: list[EvaluatedTargets]) -> list[tuple[EvaluatedTargets, EvaluatedTargets, str]]:
    """(model, compared_with, relation) for every comparison the table makes (see the module's docstring)."""
    by_stage = {stage: [t for t in evaluated if t.stage == stage] for stage in (*STAGE_ORDER, BASELINE_STAGE)}
    present = [stage for stage in STAGE_ORDER if by_stage[stage]]
    found = [
        (model, earlier, _relation(before, after))
        for before, after in zip(present, present[1:])
        for model in by_stage[after]
        for earlier in by_stage[before]
    ]
    if len(present) > 2 and present[0] == "base":  # the last stage's gain over base, when base is not its predecessor
        found += [(model, base, "base") for model in by_stage[present[-1]] for base in by_stage["base"]]
    found += [
        (model, baseline, "retrieval baseline")
        for model in evaluated
        if model.stage != BASELINE_STAGE
        for baseline in by_stage[BASELINE_STAGE]
    ]
    return found


def _relation(before: str, after: str) -> str:
    """The relation "started from", except where base is the nearest evaluated stage but not the one `after`
    trained from (`evaluate.checkpoints: shipped` evaluates base and one checkpoint): then "base"."""
    if before == "base" and STAGE_ORDER.index(after) > 1:
        return "base"
    return "started from"


def comparisons(evaluated: list[EvaluatedTargets]) -> list[Comparison]:
    """Every pair's paired differences per domain and overall (`all`), on the targets both scored; a
    measure neither side of a pair has on a shared target (CE of the retrieval baseline) is left out."""
    found = []
    for model, other, relation in pairs(evaluated):
        domains = sorted(set(model.domains.values()) & set(other.domains.values())) + ["all"]
        for domain in domains:
            for measure, lower_is_better in COMPARED:
                difference = paired_by_key(model.of(measure, domain), other.of(measure, domain))
                if difference.mean is not None:
                    found.append(
                        Comparison(model.model, other.model, relation, domain, measure, difference, lower_is_better)
                    )
    return found


def with_intervals(store, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table's rows (each with its `evaluation_id` and `domain`), each with its intervals
    (`INTERVAL_COLUMNS`), `score_ci` (`41.1 [35.2, 47.0]`), and `comparisons`: the rows
    (`Comparison.row`) of its paired comparisons on its domain."""
    evaluated = evaluated_targets(store, sorted({row["evaluation_id"] for row in rows}))
    by_id = {targets.evaluation_id: targets for targets in evaluated}
    compared = comparisons(evaluated)
    annotated = []
    for row in rows:
        targets = by_id.get(row["evaluation_id"])
        intervals = measure_intervals(targets, row["domain"]) if targets else {}
        bounds = intervals.get("score") or Interval(None, None, None, 0)
        score = Interval(row["score"], bounds.low, bounds.high, bounds.n)  # the table's own value, its interval
        mine = [c.row() for c in compared if c.model == row["model"] and c.domain == row["domain"]]
        annotated.append({**row, **interval_columns(intervals), "score_ci": score.text(), "comparisons": mine})
    return annotated
