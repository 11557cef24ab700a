"""Error bars and paired comparisons of the evaluation table (issue 28, item 3).

- The interval math on cases whose answer is known: a constant column has a zero-width interval; two
  identical models differ by exactly 0 [0, 0]; a clearly shifted model is measurable, in the right
  direction (and for CE, where lower is better, the other way round); the same rows give the same
  interval every time.
- The table from a real DuckDB store with hand-made `eval_predictions` rows, aggregated by the stage's
  own `_aggregate`: every row carries its intervals, every trained model its paired comparison with the
  model it started from, the last with base, every model with the retrieval baseline; unscored rows
  (failed or excluded empty generations) are left out as the aggregates leave them out; the summary,
  the model card's table and its comparisons say it in words.
"""

from datetime import datetime

import pytest

from pipeline.evaluation.comparison import INTERVAL_COLUMNS, pairs
from pipeline.evaluation.intervals import (
    Interval,
    bootstrap_macro_mean,
    bootstrap_mean,
    change_words,
    paired_by_key,
    paired_difference,
    verdict,
)
from pipeline.evaluation.report import evaluation_rows, markdown_table, table_rows

NOISE = [((7 * i) % 11 - 5) / 2 for i in range(40)]  # a fixed spread of -2.5..2.5, mean near 0


@pytest.mark.parametrize(
    ("case", "values", "expected"),
    [
        ("a constant column has no spread", [62.5] * 12, Interval(62.5, 62.5, 62.5, 12)),
        ("one target: the value itself", [40.0], Interval(40.0, 40.0, 40.0, 1)),
        ("no value: no mean", [None, None], Interval(None, None, None, 0)),
        ("None is left out, not zero", [1.0, None, 1.0], Interval(1.0, 1.0, 1.0, 2)),
    ],
)
def test_bootstrap_mean_on_known_cases(case, values, expected):
    assert bootstrap_mean(values) == expected, case


def test_an_interval_brackets_the_mean_and_is_the_same_every_time():
    values = [50 + x * 10 for x in NOISE]
    interval = bootstrap_mean(values)
    assert interval.low < interval.mean < interval.high and interval.n == 40
    assert interval == bootstrap_mean(values)  # seeded: a report says the same from the same rows
    assert interval.half_width == pytest.approx((interval.high - interval.low) / 2)
    assert bootstrap_mean(values, seed=1) != interval  # the seed is what makes it repeatable


@pytest.mark.parametrize(
    ("case", "after", "before", "lower_is_better", "expected_verdict"),
    [
        ("identical models", [40 + x for x in NOISE], [40 + x for x in NOISE], False, "no measurable change"),
        ("shifted up by 20 points", [60 + x for x in NOISE], [40 + x for x in NOISE[::-1]], False, "improved"),
        ("shifted down by 20 points", [20 + x for x in NOISE], [40 + x for x in NOISE[::-1]], False, "WORSE"),
        (
            "noise only: crosses zero",
            [40 + x for x in NOISE],
            [40 + x for x in NOISE[::-1]],
            False,
            "no measurable change",
        ),
        (
            "CE down by 0.5 nats: better",
            [1.5 + x / 10 for x in NOISE],
            [2.0 + x / 10 for x in NOISE[::-1]],
            True,
            "improved",
        ),
        ("CE up by 0.5 nats: worse", [2.5 + x / 10 for x in NOISE], [2.0 + x / 10 for x in NOISE[::-1]], True, "WORSE"),
    ],
)
def test_paired_differences_and_their_verdicts(case, after, before, lower_is_better, expected_verdict):
    difference = paired_difference(after, before)
    assert verdict(difference, lower_is_better) == expected_verdict, case
    assert difference.measurable == (expected_verdict != "no measurable change"), case


def test_identical_models_differ_by_exactly_zero():
    difference = paired_difference([40 + x for x in NOISE], [40 + x for x in NOISE])
    assert (difference.mean, difference.low, difference.high) == (0.0, 0.0, 0.0)
    assert change_words(difference) == "no measurable change +0.0 [+0.0, +0.0]"


@pytest.mark.parametrize(
    ("interval", "what", "lower_is_better", "digits", "expected"),
    [
        (Interval(6.3, 1.2, 11.0, 30), "", False, 1, "improved +6.3 [+1.2, +11.0]"),
        (Interval(-4.0, -7.9, -0.6, 30), "val score", False, 1, "val score WORSE -4.0 [-7.9, -0.6]"),
        (Interval(1.0, -2.1, 4.3, 30), "", False, 1, "no measurable change +1.0 [-2.1, +4.3]"),
        (
            Interval(-0.12, -0.2, -0.05, 30),
            "observation_ce",
            True,
            3,
            "observation_ce improved -0.120 [-0.200, -0.050]",
        ),
    ],
)
def test_change_words(interval, what, lower_is_better, digits, expected):
    assert change_words(interval, what, lower_is_better, digits) == expected


def test_paired_by_key_uses_only_the_targets_both_scored():
    difference = paired_by_key({"a": 80.0, "b": 60.0, "c": None}, {"a": 50.0, "b": 30.0, "d": 10.0})
    assert (difference.mean, difference.low, difference.high, difference.n) == (30.0, 30.0, 30.0, 2)


def test_the_macro_mean_weighs_every_domain_alike():
    # 10 targets at 100 in one domain, 2 at 0 in another: pooled 83.3, macro 50; constant within each domain.
    interval = bootstrap_macro_mean([[100.0] * 10, [0.0] * 2, [None]])
    assert (interval.mean, interval.low, interval.high, interval.n) == (50.0, 50.0, 50.0, 12)
    spread = bootstrap_macro_mean([[100.0, 0.0] * 5, [50.0] * 2])
    assert spread.low < spread.mean == 50.0 < spread.high


# -- the table from a store --------------------------------------------------------------------------------------
DOMAINS = ("terminal", "terminal", "terminal", "mcp", "mcp", "mcp") * 2  # 12 targets in two domains


def _judged(raw: float, ce: float | None = None, exact: bool = False, status: str = "ok") -> dict:
    return {
        "parse_status": status,
        "judge_raw": raw,
        "judge_valid": True,
        "similarity": 0.5,
        "semantic_match": raw >= 3,
        "rouge_l": (raw - 1) / 4,
        "exact_match": exact,
        "exact": exact,
        "line_agreement": 0.5,
        "ce_sum": None if ce is None else ce * 10,
        "ce_tokens": None if ce is None else 10,
    }


UNSCORED = {"parse_status": "generation_failed", "judge_raw": None}
# base scores 1, 2, 3 in turn; cpt two points more on every target (+50 on the 0-100 scale) with lower CE;
# sft answers exactly as cpt; the retrieval baseline scores 3 everywhere and has no CE. cpt's target 11
# failed to generate and sft's target 10 was an empty generation left out: neither enters a mean.
MODELS = {
    "base": [_judged(1 + i % 3, ce=2.0 + i % 3 / 10) for i in range(12)],
    "cpt": [_judged(3 + i % 3, ce=1.5 + i % 3 / 10, exact=i % 3 == 2) for i in range(11)] + [UNSCORED],
    "sft": [_judged(3 + i % 3, ce=1.5 + i % 3 / 10, exact=i % 3 == 2) for i in range(10)]
    + [{"parse_status": "empty_generation", "judge_raw": None}, _judged(5.0, ce=1.7, exact=True)],
    "retrieval baseline": [_judged(3.0) for _ in range(12)],
}
STAGES = {"base": "base", "cpt": "cpt", "sft": "sft", "retrieval baseline": "baseline"}


def _evaluated_store(store) -> list[str]:
    """One completed evaluation per model on the same eval set and judge, aggregated as the stage does."""
    from stages.evaluate import _aggregate

    ids = []
    for model, rows in MODELS.items():
        evaluation_id = f"eval-{STAGES[model]}"
        store.execute(
            "INSERT INTO evaluations VALUES (?, ?, ?, ?, NULL, 'non_thinking', ?, 'eval pool, 12 target turns', "
            "'set-fp', 'semantic', 'judge-fp', 12, false, now(), NULL)",
            [evaluation_id, f"{model}-checkpoint", model, STAGES[model], f"{model}-fp"],
        )
        for i, (domain, row) in enumerate(zip(DOMAINS, rows)):
            columns = {
                "evaluation_id": evaluation_id,
                "query_id": f"q{i:02d}",
                "trajectory_id": f"t{i}",
                "turn_index": 1,
                "domain": domain,
                "created_at": datetime(2026, 12, 2),
                "seen_in_training": i == 0,
                **row,
            }
            store.execute(
                f"INSERT INTO eval_predictions ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                list(columns.values()),
            )
        _aggregate(store, evaluation_id)
        ids.append(evaluation_id)
    return ids


def _comparisons(rows: list[dict]) -> dict[tuple[str, str, str, str], dict]:
    return {(c["model"], c["compared_with"], c["domain"], c["measure"]): c for row in rows for c in row["comparisons"]}


def test_every_row_carries_its_intervals(store):
    rows = table_rows(store, _evaluated_store(store))
    overall = {row["model"]: row for row in rows if row["domain"] == "all"}

    assert all(set(INTERVAL_COLUMNS) <= set(row) for row in rows)
    base, baseline = overall["base"], overall["retrieval baseline"]
    assert base["score_low"] < base["score"] < base["score_high"] and base["score_pm"] > 0
    assert base["score_ci"] == f"{base['score']:.1f} [{base['score_low']:.1f}, {base['score_high']:.1f}]"
    # A constant column: the retrieval baseline scores 50 on every target, parses every answer.
    assert (baseline["score"], baseline["score_low"], baseline["score_high"], baseline["score_pm"]) == (
        50.0,
        50.0,
        50.0,
        0.0,
    )
    assert (baseline["parse_rate_low"], baseline["parse_rate_high"]) == (1.0, 1.0)
    assert baseline["observation_ce_low"] is None  # not a language model: no CE, no interval
    # The macro mean's interval on the `all` row only; score_unseen's without the seen target q00.
    assert base["score_macro_low"] <= base["score_macro"] <= base["score_macro_high"]
    assert all(row["score_macro_low"] is None for row in rows if row["domain"] != "all")
    assert overall["sft"]["score_unseen_low"] <= overall["sft"]["score_unseen"] <= overall["sft"]["score_unseen_high"]
    # The CE interval is of the mean per-target CE, the value token-weighted: with equal token counts they agree.
    assert base["observation_ce_low"] < base["observation_ce"] < base["observation_ce_high"]


def test_each_trained_model_is_compared_with_the_model_it_started_from(store):
    rows = table_rows(store, _evaluated_store(store))
    compared = _comparisons(rows)

    relations = {(model, other): c["relation"] for (model, other, domain, measure), c in compared.items()}
    assert relations == {
        ("cpt", "base"): "started from",
        ("sft", "cpt"): "started from",
        ("sft", "base"): "base",
        ("base", "retrieval baseline"): "retrieval baseline",
        ("cpt", "retrieval baseline"): "retrieval baseline",
        ("sft", "retrieval baseline"): "retrieval baseline",
    }
    # +2 on the 1-5 scale on every target both scored (cpt's failed target 11 left out): +50 exactly.
    gain = compared["cpt", "base", "all", "score"]
    assert (gain["difference"], gain["low"], gain["high"], gain["targets"]) == (50.0, 50.0, 50.0, 11)
    assert gain["verdict"] == "improved" and gain["comparison"] == "cpt vs base +50.0 [+50.0, +50.0]"
    # sft answers as cpt did: exactly 0 [0, 0] on the 10 targets both scored (cpt's failed 11 and sft's empty 10 out).
    same = compared["sft", "cpt", "all", "score"]
    assert (same["difference"], same["low"], same["high"], same["targets"]) == (0.0, 0.0, 0.0, 10)
    assert same["verdict"] == "no measurable change"
    # CE: model - compared_with, lower is better, so cpt's 0.5 nats less is an improvement.
    ce = compared["cpt", "base", "all", "observation_ce"]
    assert ce["difference"] == pytest.approx(-0.5) and ce["verdict"] == "improved"
    assert compared["cpt", "base", "all", "exact_match"]["difference"] == pytest.approx(3 / 11)  # targets 2, 5, 8
    assert ("cpt", "retrieval baseline", "all", "observation_ce") not in compared  # the baseline has no CE
    assert compared["cpt", "base", "mcp", "score"]["targets"] == 5  # per domain too


def test_the_summary_and_the_card_say_it_in_words(store):
    from stages.evaluate import EvalSet, _summary

    ids = _evaluated_store(store)
    rows = table_rows(store, ids)
    compared = [c for row in rows for c in row["comparisons"]]
    summary = _summary(
        rows, compared, EvalSet("eval pool, 12 target turns", [], "set-fp", frozenset(), {}, {}), "semantic", 0, 4
    )
    card_rows = evaluation_rows(store, "cpt-checkpoint")
    card = markdown_table(card_rows)

    assert "cpt vs base improved +50.0 [+50.0, +50.0]" in summary
    assert "sft vs cpt no measurable change +0.0 [+0.0, +0.0]" in summary
    assert "sft vs base improved" in summary and "vs retrieval baseline" not in summary
    assert "retrieval baseline 50.0 [50.0, 50.0] / 50.0 [50.0, 50.0]" in summary
    assert [row["score_ci"] for row in card_rows] == [row["score_ci"] for row in rows]  # the card's rows as the stage's
    assert "| retrieval baseline | all | 12 | 50.0 [50.0, 50.0] |" in card
    # 3 exact matches of 11 more than base: an interval that reaches 0 is no measurable change.
    assert (
        "- cpt vs base (started from): score improved +50.0 [+50.0, +50.0]; exact_match no measurable change "
        "+0.273 [+0.000, +0.545]; observation_ce improved -0.500 [-0.500, -0.500]"
    ) in card
    assert "lower is better" in card


def test_pairs_follow_the_stage_order_among_the_models_present():
    from pipeline.evaluation.comparison import EvaluatedTargets

    def evaluated(*stages: str) -> list[EvaluatedTargets]:
        return [EvaluatedTargets(f"eval-{s}", s, s, {}, {}) for s in stages]

    def named(*stages: str) -> set[tuple[str, str, str]]:
        return {(model.model, other.model, relation) for model, other, relation in pairs(evaluated(*stages))}

    assert named("base", "cpt", "sft", "rl") == {
        ("cpt", "base", "started from"),
        ("sft", "cpt", "started from"),
        ("rl", "sft", "started from"),
        ("rl", "base", "base"),
    }
    # No sft evaluated: rl is compared with the stage before it that is present.
    assert named("base", "cpt", "rl", "baseline") == {
        ("cpt", "base", "started from"),
        ("rl", "cpt", "started from"),
        ("rl", "base", "base"),
        ("base", "baseline", "retrieval baseline"),
        ("cpt", "baseline", "retrieval baseline"),
        ("rl", "baseline", "retrieval baseline"),
    }
    assert named("base", "cpt") == {("cpt", "base", "started from")}  # base is its predecessor: no second pair
    # `evaluate.checkpoints: shipped`: base and the shipped checkpoint; rl did not start from base, so it is "base".
    assert named("base", "rl", "baseline") == {
        ("rl", "base", "base"),
        ("base", "baseline", "retrieval baseline"),
        ("rl", "baseline", "retrieval baseline"),
    }
    assert named("base", "cpt", "baseline") - {("base", "baseline", "retrieval baseline")} == {
        ("cpt", "base", "started from"),
        ("cpt", "baseline", "retrieval baseline"),
    }
    assert named("external", "baseline") == {("external", "baseline", "retrieval baseline")}


def test_the_printed_table_shows_each_value_with_its_interval(store):
    from rich.console import Console

    from pipeline.cli import _print_rows

    rows = [row for row in table_rows(store, _evaluated_store(store)) if row["domain"] == "all"]
    out = Console(record=True, width=250)
    _print_rows(out, rows, "scores", ("model", "queries", "score", "parse_rate", "perplexity"))
    printed = out.export_text()
    base = next(row for row in rows if row["model"] == "base")
    assert base["score_ci"] in printed and "1.000 [1.000, 1.000]" in printed
    assert f"{base['perplexity']:.3f}" in printed  # a value without an interval, as before
