"""The filter rules as a specification: a trajectory, the config, what is kept, which turns go, and why."""

import re
from typing import Any

import pytest

from pipeline.config import ConfigError, load_config
from pipeline.config.filter import FilterConfig
from pipeline.filters import build_rules
from pipeline.filters.patterns import _EXTRA_FOLDS, PatternSet, _required_literals
from pipeline.schema import SystemPrompt, Trajectory, Turn

SEARCH_TOOLS = [{"type": "function", "function": {"name": "search"}}, {"name": "open_page"}]
A_SCREEN = "[1] RootWebArea 'Shop'\n  [2] button 'Add to cart'"
A_SCREEN_REINDENTED = "[1]   RootWebArea 'Shop'\n\t[2] button   'Add to cart'\n"
ANOTHER_SCREEN = "[1] RootWebArea 'Cart'\n  [2] text '1 item'"


def turn(action: str = "ls", observation: str = "file.txt", **fields: Any) -> Turn:
    return Turn(action, observation, **fields)


def trajectory(*turns: Turn, domain: str = "terminal", tools: list | None = None) -> Trajectory:
    return Trajectory(source="test", domain=domain, turns=list(turns), system=SystemPrompt("simulate", tools=tools or []))


OK = turn("cat a.txt", "hello")
OK2 = turn("wc -l a.txt", "1 a.txt")
MALFORMED = turn("lss -la", "Error: invalid action format, expected one bash command")
FORMAT_ERROR = turn("{bad json", "could not read your call", is_error=True, metadata={"kind": "format_error"})

# (name, filter config overrides, trajectory, kept?, dropped turn indices, reason fragment)
CASES = [
    # min_turns (SPEC: fewer than 2 turns), counted after turn-level removals
    ("two turns are enough", {}, trajectory(OK, OK2), True, [], None),
    ("one turn is too few", {}, trajectory(OK), False, [], "1 turn (< 2)"),
    ("on the threshold of 3", {"min_turns": 3}, trajectory(OK, OK2, OK), True, [], None),
    ("below the threshold of 3", {"min_turns": 3}, trajectory(OK, OK2), False, [], "2 turns (< 3)"),
    ("min_turns None disables", {"min_turns": None}, trajectory(OK), True, [], None),
    (
        "counted after turn-level filtering",
        {},
        trajectory(OK, turn("   ", "bash: syntax error")),
        False,
        [1],
        "1 turn after turn-level filtering (< 2)",
    ),
    (
        "a retry cycle can leave too few",
        {},
        trajectory(MALFORMED, OK),
        False,
        [0],
        "1 turn after turn-level filtering (< 2)",
    ),
    # action space: only trajectories that declare tools; turns without a tool name are not calls
    (
        "declared tools in both forms",
        {},
        trajectory(turn(tool_name="search"), turn(tool_name="open_page"), domain="mcp", tools=SEARCH_TOOLS),
        True,
        [],
        None,
    ),
    (
        "an undeclared tool drops the trajectory",
        {},
        trajectory(turn(tool_name="search"), turn(tool_name="delete_all"), domain="mcp", tools=SEARCH_TOOLS),
        False,
        [],
        "turn 1 calls 'delete_all', not one of the 2 declared tools",
    ),
    (
        "no declared tools: not checked",
        {},
        trajectory(turn(tool_name="anything"), turn(tool_name="else"), domain="mcp"),
        True,
        [],
        None,
    ),
    (
        "a turn without a tool name is not a call",
        {},
        trajectory(turn(tool_name="search"), turn(), domain="mcp", tools=SEARCH_TOOLS),
        True,
        [],
        None,
    ),
    (
        "check_action_space False disables",
        {"check_action_space": False},
        trajectory(turn(tool_name="search"), turn(tool_name="delete_all"), domain="mcp", tools=SEARCH_TOOLS),
        True,
        [],
        None,
    ),
    (
        "a rejected unknown tool is a retry cycle, not an action-space violation",
        {},
        trajectory(
            turn(tool_name="bogus", observation="Error: unknown tool 'bogus'"),
            turn(tool_name="search"),
            turn(tool_name="open_page"),
            domain="mcp",
            tools=SEARCH_TOOLS,
        ),
        True,
        [0],
        "malformed action",
    ),
    # environment failure: short observations matching a pattern taint the whole run
    (
        "a CAPTCHA page",
        {},
        trajectory(OK, turn("click 'Search'", "Please verify you are a human"), domain="web"),
        False,
        [],
        "turn 1: observation matches environment failure pattern",
    ),
    ("an HTTP error page", {}, trajectory(OK, turn("curl x", "HTTP/1.1 503")), False, [], "500|502|503|504"),
    ("a harness timeout", {}, trajectory(OK, turn("make", "Command timed out after 300s")), False, [], "timed? ?out"),
    (
        "unusual case folding still matches (re's IGNORECASE: U+017F is s)",
        {},
        trajectory(OK, turn("curl x", "\u017ftatus 502")),
        False,
        [],
        "environment failure",
    ),
    (
        "on the length limit: searched",
        {"environment_failure_max_chars": 40},
        trajectory(OK, turn("open", "captcha".ljust(40, "."))),
        False,
        [],
        "captcha",
    ),
    (
        "over the length limit: a page that mentions it is content",
        {"environment_failure_max_chars": 40},
        trajectory(OK, turn("open", "captcha".ljust(41, "."))),
        True,
        [],
        None,
    ),
    (
        "a failure in a removed turn still counts",
        {},
        trajectory(OK, OK2, turn("", "503 Service Unavailable")),
        False,
        [2],
        "turn 2: observation matches environment failure",
    ),
    (
        "a pattern without a literal is searched directly",
        {"environment_failure_patterns": [r"\bE\d{3}\b"]},
        trajectory(OK, turn("run", "fatal E042 reached")),
        False,
        [],
        r"`\bE\d{3}\b`",
    ),
    (
        "environment_failure_patterns None disables",
        {"environment_failure_patterns": None},
        trajectory(OK, turn("open", "captcha")),
        True,
        [],
        None,
    ),
    # the first failing trajectory rule, in SPEC order, gives the reason
    ("min_turns before environment failure", {}, trajectory(turn("open", "captcha")), False, [], "1 turn (< 2)"),
    # empty actions
    ("a whitespace action is removed", {}, trajectory(OK, turn(" \n\t", "$"), OK2), True, [1], "empty action"),
    ("drop_empty_actions False disables", {"drop_empty_actions": False}, trajectory(OK, turn("", "$"), OK2), True, [], None),
    # retry cycles: drop the failed pair, keep the retry and everything before it
    (
        "a malformed action and its error, then the retry",
        {},
        trajectory(OK, MALFORMED, OK2, OK),
        True,
        [1],
        "retried at turn 2",
    ),
    ("the last turn is not a retry cycle", {}, trajectory(OK, OK2, MALFORMED), True, [], None),
    ("an adapter-flagged format error", {}, trajectory(OK, FORMAT_ERROR, OK2), True, [1], "format error retried at turn 2"),
    (
        "a real error is not a format error",
        {},
        trajectory(OK, turn("cat nope", "No such file", is_error=True), OK2),
        True,
        [],
        None,
    ),
    ("two failed attempts in a row", {}, trajectory(OK, MALFORMED, FORMAT_ERROR, OK2), True, [1, 2], "retried at turn 3"),
    (
        "a failed pair followed only by removed turns has no retry",
        {},
        trajectory(OK, MALFORMED, turn("", "$")),
        True,
        [2],
        "empty action",
    ),
    (
        "anchored patterns: the words mid-text are not an error",
        {},
        trajectory(OK, turn("grep -r x", "tests say: invalid action is rejected"), OK2),
        True,
        [],
        None,
    ),
    (
        "malformed_action_patterns None disables (flags too)",
        {"malformed_action_patterns": None},
        trajectory(OK, MALFORMED, FORMAT_ERROR, OK2),
        True,
        [],
        None,
    ),
    # GUI no-change, against the previous kept observation, whitespace-normalised
    (
        "an unchanged web screen",
        {},
        trajectory(
            turn("click [9]", A_SCREEN),
            turn("hover [2]", A_SCREEN_REINDENTED),
            turn("click [2]", ANOTHER_SCREEN),
            domain="web",
        ),
        True,
        [1],
        "observation unchanged from turn 0",
    ),
    (
        "compared with the last kept screen, across a removed retry",
        {},
        trajectory(
            turn("click [9]", A_SCREEN),
            turn("clik [2]", "Error: invalid action"),
            turn("scroll down", A_SCREEN),
            turn("click [2]", ANOTHER_SCREEN),
            domain="android",
        ),
        True,
        [1, 2],
        "unchanged from turn 0",
    ),
    ("not a GUI domain", {}, trajectory(turn("pwd", "/root"), turn("pwd", "/root")), True, [], None),
    (
        "gui_domains None disables",
        {"gui_domains": None},
        trajectory(turn("click", A_SCREEN), turn("click", A_SCREEN), turn("tap", ANOTHER_SCREEN), domain="web"),
        True,
        [],
        None,
    ),
    (
        "gui_domains is configuration",
        {"gui_domains": ["terminal"]},
        trajectory(turn("pwd", "/root"), turn("pwd", "/root"), turn("ls", "a b")),
        True,
        [1],
        "unchanged",
    ),
]


def _reasons(verdict) -> str:
    reasons = [reason for _, _, reason in verdict.turn_drops]
    if verdict.trajectory_drop:
        reasons.append(verdict.trajectory_drop[1])
    return " | ".join(reasons)


@pytest.mark.parametrize(
    ("overrides", "case", "kept", "dropped_turns", "reason"),
    [pytest.param(*case, id=name) for name, *case in CASES],
)
def test_rule(overrides, case, kept, dropped_turns, reason):
    verdict = build_rules(FilterConfig(**overrides)).judge(case)
    assert verdict.kept is kept, _reasons(verdict)
    assert sorted(index for index, _, _ in verdict.turn_drops) == dropped_turns, _reasons(verdict)
    assert verdict.kept_turns == [i for i in range(len(case.turns)) if i not in dropped_turns]
    if reason is None:
        assert verdict.trajectory_drop is None and not verdict.turn_drops
    else:
        assert reason in _reasons(verdict)


def test_a_batch_is_judged_as_each_trajectory_alone():
    """The batch form (one pattern screen over all observations) must not mix trajectories up."""
    rules = build_rules(FilterConfig())
    cases = [case for _, overrides, case, *_ in CASES if not overrides]
    assert rules.judge_batch(cases) == [rules.judge(case) for case in cases]


def test_none_disables_by_not_building_the_rule():
    everything_off = FilterConfig(
        min_turns=None,
        check_action_space=None,
        environment_failure_patterns=None,
        drop_empty_actions=None,
        malformed_action_patterns=None,
        gui_domains=None,
    )
    rules = build_rules(everything_off)
    assert rules.turn_rules == [] and rules.trajectory_rules == []
    defaults = build_rules(FilterConfig())
    assert [r.name for r in defaults.turn_rules] == ["empty_action", "retry_cycle", "gui_no_change"]
    assert [r.name for r in defaults.trajectory_rules] == ["min_turns", "action_space", "environment_failure"]


def test_an_invalid_pattern_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"filter\.malformed_action_patterns.*pattern 1 \('\(unclosed'\)"):
        load_config(None, [{"filter": {"malformed_action_patterns": ["ok", "(unclosed"]}}])


@pytest.mark.parametrize(
    ("pattern", "required"),
    [
        (r"(?i)\bcaptcha\b", {("captcha", True)}),
        (r"(?i)\bsnapshot (not found|missing)\b", {("snapshot ", True)}),
        (r"(?i)^\s*(error: )?(invalid|malformed) action", {(" action", True)}),
        (r"(?i)\b(HTTP|status)[ /]?(500|503)\b", {("http", True), ("status", True)}),
        (r"Trace(?i: \(most recent)", {(" (most recent", True)}),
        (r"Traceback(?i: \(m)", {("Traceback", False)}),
        (r"(abc)+d", {("abc", False)}),
        (r"x(?:y|)zz", {("zz", False)}),
        (r"\d{3}", None),
        (r"[Cc]aptcha", {("aptcha", False)}),
    ],
)
def test_required_literals(pattern, required):
    found = _required_literals(pattern)
    assert (None if found is None else set(found)) == required


SCREEN_PATTERNS = [r"(?i)\bcaptcha\b", r"(?i)kernel panic", r"Traceback \(most", r"(?i)\bstatus 50[0-4]\b"]
SCREEN_TEXTS = [
    "CAPTCHA required",
    "a captcha",
    "captchas",
    "\u212aernel PANIC",  # Kelvin sign folds to k
    "\u017ftatus 503",  # long s folds to s
    "STATUS 503",
    "traceback (most recent call last)",
    "Traceback (most recent call last)",
    "İ kernel panic",
    "nothing to see",
    "",
]


def test_the_screen_finds_exactly_what_re_finds():
    patterns = PatternSet(SCREEN_PATTERNS)
    assert patterns.screen is not None
    expected = {}
    for position, text in enumerate(SCREEN_TEXTS):
        for pattern in SCREEN_PATTERNS:
            if re.search(pattern, text):
                expected[position] = pattern
                break
    assert patterns.search_all(SCREEN_TEXTS) == expected
    assert set(expected) == {0, 1, 3, 4, 5, 7, 8}


def test_the_extra_case_folds_are_all_that_re_knows():
    """Re-derive which non-ASCII characters `re` matches case-insensitively with an ASCII
    character: the screen's character classes must include every one of them."""
    every_char = "".join(chr(c) for c in range(128, 0x110000) if not 0xD800 <= c < 0xE000)
    folds: dict[str, str] = {}
    for code in range(32, 127):
        ascii_char = chr(code)
        for match in re.finditer("(?i)" + re.escape(ascii_char), every_char):
            folds[ascii_char.lower()] = folds.get(ascii_char.lower(), "") + match.group()
    assert {key: "".join(sorted(set(value))) for key, value in folds.items()} == {
        key: "".join(sorted(value)) for key, value in _EXTRA_FOLDS.items()
    }
