"""Strict parsing of SFT candidates: the expected status for each shape, and nothing repaired."""

import pytest

from pipeline.sft.candidates import parse_candidate, render_thinking_output

CASES = [
    # (why, text, status, thinking, prediction)
    ("Qwen3's format", "<think>\nls lists the dir\n</think>\n\nfile.txt\n", "ok", "ls lists the dir", "file.txt\n"),
    ("one newline after the block", "<think>x</think>\nout", "ok", "x", "out"),
    ("no separator at all", "<think>x</think>out", "ok", "x", "out"),
    ("leading spaces of the output are kept", "<think>x</think>\n\n  indented", "ok", "x", "  indented"),
    ("a third newline belongs to the output", "<think>x</think>\n\n\nafter blank", "ok", "x", "\nafter blank"),
    ("leading whitespace before the block", "  \n<think>x</think>\n\ny", "ok", "x", "y"),
    ("an empty observation is an observation (mkdir prints nothing)", "<think>x</think>\n\n", "ok", "x", ""),
    ("request failed: no text", None, "generation_failed", None, None),
    ("no thinking block", "file.txt", "missing_think", None, None),
    ("text before the block is not repaired", "Sure! <think>x</think>\n\ny", "missing_think", None, None),
    ("block never closed", "<think>reasoning and then the output", "unclosed_think", None, None),
    ("two blocks", "<think>a</think>\n\n<think>b</think>\n\ny", "extra_think_tag", None, None),
    ("nested block", "<think>a<think>b</think></think>y", "extra_think_tag", None, None),
    ("a closing tag in the output", "<think>a</think>\n\ny</think>", "extra_think_tag", None, None),
    ("empty thinking", "<think>\n \n</think>\n\ny", "empty_thinking", None, None),
]


@pytest.mark.parametrize(("why", "text", "status", "thinking", "prediction"), CASES, ids=[c[0] for c in CASES])
def test_parse(why, text, status, thinking, prediction):
    parsed = parse_candidate(text)
    assert (parsed.status, parsed.thinking, parsed.prediction) == (status, thinking, prediction)


@pytest.mark.parametrize("observation", ["plain", "", "\nstarts with a newline", '{"a": 1}\n', "  two\n  lines  "])
def test_rendered_target_parses_back(observation):
    parsed = parse_candidate(render_thinking_output("because", observation))
    assert (parsed.status, parsed.thinking, parsed.prediction) == ("ok", "because", observation)
