"""The evaluation's score mapping, judge-free metrics, correlations and answer extraction, as tables of cases."""

import pytest

from pipeline.evaluation.metrics import agentworldbench_sql, exact_match, json_validity, semantic_match, spearman
from pipeline.evaluation.prompting import (
    DIRECT,
    NON_THINKING,
    RL_DIRECT,
    RL_THINKING,
    THINKING,
    answer_prefix,
    extract_observation,
    query_messages,
)
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.rl import rl_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.sft.queries import Query
from pipeline.store.schema import SystemPrompt


@pytest.mark.parametrize(("raw", "expected"), [(1, 0.0), (2, 25.0), (3, 50.0), (4.2, 80.0), (5, 100.0)])
def test_agentworldbench_maps_the_1_to_5_scale_onto_0_to_100(raw, expected):
    import duckdb

    [(score,)] = (
        duckdb.connect().execute(f"SELECT {agentworldbench_sql('raw')} FROM (SELECT {raw}::DOUBLE AS raw)").fetchall()
    )
    assert score == pytest.approx(expected)


@pytest.mark.parametrize(
    ("prediction", "reference", "expected", "why"),
    [
        ("hello\n", "hello", True, "trailing whitespace is not content"),
        ("a.txt  \nb.txt", "a.txt\nb.txt", True, "nor is whitespace at line ends"),
        (
            "built at 2026-11-30T19:20:01Z",
            "built at 2024-01-02T03:04:05+01:00",
            True,
            "timestamps are runtime metadata",
        ),
        ("-rw-r--r-- 1 u u 12 Nov 30 19:20 x", "-rw-r--r-- 1 u u 12 Jan  2 08:01 x", True, "so are ls dates and times"),
        ("[1] 4242", "[1] 977", True, "the PID after a job number is runtime metadata"),
        ("[1] 4242", "[2] 4242", False, "the job number is content"),
        ("Started pid 4242", "Started pid 977", True, "a PID is runtime metadata"),
        ('{"pid": 4242, "ok": true}', '{"pid": 977, "ok": true}', True, "so is a JSON field named pid"),
        ("sshd[4242]: Accepted key", "sshd[977]: Accepted key", True, "and a syslog tag's PID"),
        ('{"items": [3]}', '{"items": [4]}', False, "a bracketed number is a list's content, not a PID"),
        ("see [1] and [2]", "see [1] and [3]", False, "or a reference number"),
        ("app.py:10:15: E501", "app.py:42:59: E501", False, "a file's line and column are not a clock time"),
        ("app.py:10", "app.py:11", False, "nor is a line number"),
        ("ratio 3:2", "ratio 4:2", False, "a ratio is no clock time (minutes have two digits)"),
        ("took 3 steps", "took 4 steps", False, "a count is no duration"),
        ("[12:00:01] ready", "[08:14:59] ready", True, "a bracketed clock time is metadata"),
        ("   ", "", False, "whitespace is output: a blank line is not silence"),
        ("\n", "", False, "not even one line end"),
        ("", "", True, "silence matches silence"),
        ("\n", "\n", True, "and a blank line a blank line"),
        ("HEAD is now at 3f2a9c1 fix", "HEAD is now at a81b7e0 fix", True, "commit hashes are generated ids"),
        ("took 0.31s", "took 12 ms", True, "durations"),
        ("x = 42", "x = 43", False, "a computed value is deterministic content"),
        ("No such file", "no such file", False, "case is content"),
    ],
)
def test_exact_match_on_deterministic_content(prediction, reference, expected, why):
    assert exact_match(prediction, reference) is expected, why


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ('{"a": 1}', '{"a": 2}', True),
        ("[1, 2", "[1, 2]", False),
        ("ok", '{"status": "ok"}', False),
        ('{"a": 1}', "plain text", None),  # the metric does not apply
    ],
)
def test_json_validity_only_where_the_reference_is_json(prediction, reference, expected):
    assert json_validity(prediction, reference) is expected


@pytest.mark.parametrize(
    ("similarity", "threshold", "expected"), [(0.9, 0.5, True), (0.5, 0.5, False), (0.51, 0.5, True), (0.2, 0.9, True)]
)
def test_semantic_match_is_rwml_rule(similarity, threshold, expected):
    assert semantic_match(similarity, threshold) is expected


@pytest.mark.parametrize(
    ("xs", "ys", "expected"),
    [
        ([1, 2, 3, 4], [10, 20, 30, 40], 1.0),
        ([1, 2, 3, 4], [4, 3, 2, 1], -1.0),
        ([1, 2, 2, 3, 5], [3, 1, 2, 2, 9], 0.2894736842),  # ties at their mean rank (scipy gives the same)
        ([1, 2, 3], [5, 5, 5], None),  # one side constant: undefined
        ([1, 2], [1, 2], None),  # too few pairs
    ],
)
def test_spearman(xs, ys, expected):
    result = spearman(xs, ys)
    assert result == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize(
    ("text", "prompt_format", "status", "observation", "thinking"),
    [
        ("total 0\n", "non-thinking", "ok", "total 0\n", None),
        ("", "non-thinking", "ok", "", None),  # `mkdir x` prints nothing
        (None, "non-thinking", "generation_failed", None, None),
        ("<think>\nls lists it\n</think>\n\na.txt", "thinking", "ok", "a.txt", "ls lists it"),
        ("a.txt", "thinking", "missing_think", None, None),
        ("<think>\nnever closed", "thinking", "unclosed_think", None, None),
        ("<think>\nls lists it\n</think>\n\na.txt", "rl-thinking", "ok", "a.txt", "ls lists it"),
        ("a.txt", "rl-thinking", "missing_think", None, None),
    ],
)
def test_the_observation_is_extracted_strictly_in_the_thinking_format(
    text, prompt_format, status, observation, thinking
):
    assert extract_observation(text, prompt_format) == (status, observation, thinking)


@pytest.mark.parametrize(
    ("prompt_format", "thinking", "expected"),
    [
        ("non-thinking", None, ""),
        ("thinking", "it lists a.txt", "<think>\nit lists a.txt\n</think>\n\n"),
        ("rl-thinking", "it lists a.txt", "<think>\nit lists a.txt\n</think>\n\n"),
        # SFT never trains an observation after an empty thinking block: no trained context, no CE (issue 17, item 14).
        ("thinking", None, None),
        ("rl-thinking", None, None),
    ],
)
def test_teacher_forcing_context_before_the_observation(prompt_format, thinking, expected):
    assert answer_prefix(prompt_format, thinking) == expected


QUERY = Query("t1", 1, "terminal", SystemPrompt(task_description="a shell", action_space="bash"), (), "mkdir x", "", 0)


@pytest.mark.parametrize(
    ("stage", "thinking", "prompt_format", "expected_system"),
    [
        ("base", False, NON_THINKING, render_cpt_system_prompt("terminal", QUERY.system)),
        ("cpt", True, NON_THINKING, render_cpt_system_prompt("terminal", QUERY.system)),
        ("sft", True, THINKING, TEMPLATES[0].render("terminal", QUERY.system)),
        ("sft", False, DIRECT, TEMPLATES[0].render("terminal", QUERY.system, thinking=False)),
        # RL trains (and the export serves) in RL's own template, without a control instruction (item 14).
        ("rl", True, RL_THINKING, rl_system_prompt("terminal", QUERY.system, None)),
        ("rl", False, RL_DIRECT, rl_system_prompt("terminal", QUERY.system, None, thinking=False)),
    ],
)
def test_each_stage_is_asked_in_the_template_and_format_it_trained_in(
    stage, thinking, prompt_format, expected_system, tmp_path
):
    from pipeline.prompts.answer_format import model_format, stage_format, write_model_format

    assert stage_format(stage, thinking).name == prompt_format
    write_model_format(tmp_path, stage_format(stage, thinking))
    assert model_format(tmp_path, "sft").name == prompt_format  # the folder's record wins over the stage
    messages = query_messages(QUERY, prompt_format)
    assert messages[0] == {"role": "system", "content": expected_system} and messages[-1]["content"] == "mkdir x"


def test_every_format_is_scored_by_one_rule():
    """Issue 17, item 10: an unparsed thinking answer yields the empty observation and is judged as one,
    exactly as a non-thinking answer of nothing is; the parse status tells them apart, not the score."""
    from pipeline.config import load_config
    from pipeline.evaluation.scoring import Prediction, Scorer

    config = load_config(None, [{"evaluate": {"judge": {"kind": "semantic"}}}])
    scorer = Scorer(config.evaluate, None)
    queries = [Query("t1", 1, "terminal", QUERY.system, (), "cat a.txt", "hello world\n", 0)] * 3
    predictions = [
        Prediction("missing_think", None, None, None),
        Prediction("ok", "", None, None),
        Prediction("generation_failed", None, None, "HTTP 500"),
    ]
    unparsed, empty, failed = scorer.rows(queries, predictions)
    assert unparsed["parse_status"] == "missing_think" and empty["parse_status"] == "ok"
    assert {k: v for k, v in unparsed.items() if k not in ("parse_status", "prediction")} == {
        k: v for k, v in empty.items() if k not in ("parse_status", "prediction")
    }
    assert unparsed["judge_raw"] is not None and unparsed["judge_valid"] and unparsed["rouge_l"] == 0.0
    assert failed.get("judge_raw") is None and failed["error"] == "HTTP 500"  # the endpoint's failure: no score


def test_the_direct_instruction_asks_for_no_thinking_and_the_thinking_one_does():
    for template in TEMPLATES:
        thinking, direct = template.render("terminal", QUERY.system), template.render("terminal", QUERY.system, False)
        assert "<think>" in thinking and "think" not in direct.lower().replace("thinking", "")
    assert "<think>" not in rl_system_prompt("terminal", QUERY.system, None, thinking=False)


@pytest.mark.parametrize(
    ("text", "status", "observation"),
    [
        ("file.txt\n", "ok", "file.txt\n"),
        ("", "ok", ""),  # `mkdir x` prints nothing
        ("<think>\nls lists\n</think>\n\nfile.txt", "think_tag_in_direct", None),
        ("file.txt</think>", "think_tag_in_direct", None),
        (None, "generation_failed", None),
    ],
)
def test_a_direct_answer_is_the_observation_unless_it_writes_a_thinking_tag(text, status, observation):
    for fmt in (DIRECT, RL_DIRECT, NON_THINKING):
        assert extract_observation(text, fmt)[:2] == (status, observation)
