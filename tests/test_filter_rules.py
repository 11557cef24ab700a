"""The filter rules as a specification: a trajectory, the config, what is kept, which turns go, and why.

Each rule decides twice, in Python (the specification, `FilterRules.judge`) and in SQL (what the
filter stage runs). The table below is the specification; the SQL form is held to the Python one
on the table and on thousands of random trajectories made of the cases' hard parts.
"""

import random
import re
import sys
from collections import Counter
from typing import Any

import duckdb
import orjson
import pyarrow as pa
import pytest

from pipeline.config import ConfigError, load_config
from pipeline.config.filter import FilterConfig
from pipeline.filters import FilterRules, Verdict, build_rules
from pipeline.filters.judging import TURN_DROPS, VERDICTS, drop_judging_tables, judge_unjudged
from pipeline.filters.patterns import _EXTRA_FOLDS, PatternSet, re2_superset
from pipeline.filters.sql import PYTHON_WHITESPACE
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt, Trajectory, Turn

SEARCH_TOOLS = [{"type": "function", "function": {"name": "search"}}, {"name": "open_page"}]
A_SCREEN = "[1] RootWebArea 'Shop'\n  [2] button 'Add to cart'"
A_SCREEN_REINDENTED = "[1]   RootWebArea 'Shop'\n\t[2] button   'Add to cart'\n"
ANOTHER_SCREEN = "[1] RootWebArea 'Cart'\n  [2] text '1 item'"


def turn(action: str = "ls", observation: str = "file.txt", **fields: Any) -> Turn:
    return Turn(action, observation, **fields)


def trajectory(*turns: Turn, domain: str = "terminal", tools: list | None = None) -> Trajectory:
    return Trajectory(
        source="test", domain=domain, turns=list(turns), system=SystemPrompt("simulate", tools=tools or [])
    )


OK = turn("cat a.txt", "hello")
OK2 = turn("wc -l a.txt", "1 a.txt")
MALFORMED = turn("lss -la", "Error: invalid action format, expected one bash command")
FORMAT_ERROR = turn("{bad json", "could not read your call", is_error=True, metadata={"kind": "format_error"})

# Harness timeout messages as each harness writes them (sources in pipeline/config/filter.py).
LONG_OUTPUT = "".join(f"[*] Performing attack {n} on pub1.pub.\n[+] Time elapsed: 0.0003 sec.\n" for n in range(60))
SWE_AGENT_NO_OUTPUT_TIMEOUT = (
    "EXECUTION TIMED OUT BECAUSE NO OUTPUT WAS PRODUCED FOR MORE THAN 60.0 SECONDS.\n"
    "PLEASE REFINE YOUR RUNNING COMMAND SO IT WILL PRODUCE OUTPUT IN THE SPECIFIED TIME FRAME."
)
SWE_AGENT_CANCELLED = (
    "The command 'python -m http.server' was cancelled because it took more than 30 seconds. Please try a different "
    "command that completes more quickly."
)
MINI_SWE_AGENT_KILLED = (
    "The last command <command>pip install -e .\npytest</command> timed out and has been killed.\n"
    "The output of the command was:\n <output>\nCollecting pytest\n</output>\n"
    "Please try another command and make sure to avoid those requiring interactive input."
)
MINI_SWE_AGENT_EXCEPTION = (
    "<exception>An error occurred while executing the command: Command 'sleep 100\necho done' timed out after 30 "
    "seconds</exception>\n<returncode>-1</returncode>\n<output>\n</output>"
)
OPENHANDS_HARD_TIMEOUT = (
    "\n[The command timed out after 120.0 seconds. You may wait longer to see additional output by sending empty "
    "command '', send other commands to interact with the current process, send keys to interrupt/kill the command, "
    "or use the timeout parameter in execute_bash for future commands.]"
)
OPENHANDS_NO_NEW_OUTPUT = (
    "\n[The command has no new output after 30 seconds. You may wait longer to see additional output by sending "
    "empty command '', send other commands to interact with the current process, send keys to interrupt/kill the "
    "command, or use the timeout parameter in execute_bash for future commands.]"
)
OPENHANDS_MCP_TIMEOUT = '{"isError": true, "error": "Tool \\"fetch\\" timed out after 30 seconds", "content": []}'
TERMINUS_TIMEOUT = (
    "Previous command:\nsleep 600\n\nThe previous command timed out after 10.0 seconds\n\nIt is possible that the "
    "command is not yet finished executing. If that is the case, then do nothing.\n\n"
    "Here is the current state of the terminal:\n\n"
)
# Replies a harness rejected before they reached the environment, as it answers them.
HARNESS_REJECTIONS = [
    # Harbor's Terminus-2 (terminus_2.py; golden hello-world-invalid-json.trajectory.json)
    "Previous response had parsing errors:\nERROR: Missing required fields: analysis, plan\n"
    "WARNINGS: - Extra text detected before JSON object\n\nPlease fix these issues and provide a proper JSON response.",
    # SWE-agent, as the replay configs of the public marshmallow-1867 .traj files write its templates
    "Your output was not formatted correctly. You must always include one discussion and one command as part of "
    "your response. Make sure you do not have multiple discussion/command tags.",
    "Your output could not be parsed properly.\nPlease make sure your output includes a thought and exactly _ONE_ "
    "function call.",
    "Your action could not be parsed properly: Unexpected argument(s): pattern.",
    "Your last output did not use any tool calls!\nPlease make sure your output includes exactly _ONE_ function call!",
    "Your last output included multiple tool calls!\nPlease make sure your output includes a thought and exactly "
    "_ONE_ function call.",
    "Interactive operation 'vim' is not supported by this environment.",
    "Operation 'python' is not supported by this environment.",
    "Your bash command contained syntax errors and was NOT executed. Please fix the syntax errors and try again.",
    # mini-swe-agent 1.x and 2.x (config/default.yaml)
    "Please always provide EXACTLY ONE action in triple backticks, found 2 actions.",
    "Format error:\n\n<error>\nNo action found\n</error>\n\nHere is general guidance on how to format your response:",
    "Your previous response reached the output token limit (finish_reason=length) before you produced a complete "
    "action, so it was cut off.",
]

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
        "a pattern RE2 cannot say exactly (\\b, \\d) is screened wider, and re decides",
        {"environment_failure_patterns": [r"\bE\d{3}\b"]},
        trajectory(OK, turn("run", "fatal E042 reached")),
        False,
        [],
        r"`\bE\d{3}\b`",
    ),
    # harness timeouts: each harness's own message (pipeline/config/filter.py names the source),
    # found in an observation of any length
    (
        "SWE-agent 0.x (public rock.traj)",
        {},
        trajectory(OK, turn("./rock\n", "\nEXECUTION TIMED OUT")),
        False,
        [],
        "turn 1: observation matches harness timeout pattern `(?m)^EXECUTION TIMED OUT\\b`",
    ),
    (
        "SWE-agent 0.x after 3,380 characters of output (public BabyTimeCapsule.traj)",
        {},
        trajectory(OK, turn("RsaCtfTool --publickey pub1.pub --attack all", LONG_OUTPUT + SWE_AGENT_NO_OUTPUT_TIMEOUT)),
        False,
        [],
        "harness timeout pattern `(?m)^EXECUTION TIMED OUT",
    ),
    (
        "SWE-agent 1.x",
        {},
        trajectory(OK, turn("python -m http.server", SWE_AGENT_CANCELLED)),
        False,
        [],
        "was cancelled because it took more than",
    ),
    (
        "mini-swe-agent 1.x",
        {},
        trajectory(OK, turn("pip install -e .\npytest", MINI_SWE_AGENT_KILLED)),
        False,
        [],
        "timed out and has been killed",
    ),
    (
        "mini-swe-agent 2.x",
        {},
        trajectory(OK, turn("sleep 100\necho done", MINI_SWE_AGENT_EXCEPTION)),
        False,
        [],
        "An error occurred while executing the command: Command",
    ),
    (
        "OpenHands hard timeout after long output",
        {},
        trajectory(OK, turn("pytest", LONG_OUTPUT + OPENHANDS_HARD_TIMEOUT)),
        False,
        [],
        "harness timeout pattern `\\[The command timed out after",
    ),
    (
        "OpenHands MCP tool timeout",
        {},
        trajectory(OK, turn("fetch", OPENHANDS_MCP_TIMEOUT, tool_name="fetch")),
        False,
        [],
        "harness timeout pattern `Tool",
    ),
    (
        "Terminus-2 with the terminal state",
        {},
        trajectory(OK, turn("sleep 600", TERMINUS_TIMEOUT + LONG_OUTPUT)),
        False,
        [],
        "harness timeout pattern `The previous command timed out",
    ),
    (
        "OpenHands' no-new-output notice: the command still runs, not a timeout",
        {},
        trajectory(OK, turn("pip install torch", LONG_OUTPUT + OPENHANDS_NO_NEW_OUTPUT)),
        True,
        [],
        None,
    ),
    (
        "a long page that talks about a timeout is content",
        {},
        trajectory(OK, turn("cat CHANGELOG.md", LONG_OUTPUT + "\n- the command timed out after 30 seconds\n")),
        True,
        [],
        None,
    ),
    (
        "harness_timeout_patterns None disables",
        {"harness_timeout_patterns": None},
        trajectory(OK, turn("./rock\n", "\nEXECUTION TIMED OUT")),
        True,
        [],
        None,
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
    (
        "drop_empty_actions False disables",
        {"drop_empty_actions": False},
        trajectory(OK, turn("", "$"), OK2),
        True,
        [],
        None,
    ),
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
    (
        "an adapter-flagged format error",
        {},
        trajectory(OK, FORMAT_ERROR, OK2),
        True,
        [1],
        "format error retried at turn 2",
    ),
    (
        "a real error is not a format error",
        {},
        trajectory(OK, turn("cat nope", "No such file", is_error=True), OK2),
        True,
        [],
        None,
    ),
    (
        "two failed attempts in a row",
        {},
        trajectory(OK, MALFORMED, FORMAT_ERROR, OK2),
        True,
        [1, 2],
        "retried at turn 3",
    ),
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
    # Harness rejections found in the public data or the harnesses' source (pipeline/config/filter.py)
    *[
        (
            f"rejected by the harness: {message[:40]!r}",
            {},
            trajectory(OK, turn("<reply>", message), OK2),
            True,
            [1],
            "malformed action",
        )
        for message in HARNESS_REJECTIONS
    ],
    (
        "Terminus-2's warnings come with the terminal's answer: the command ran",
        {},
        trajectory(
            OK,
            turn(
                "ls",
                "Previous response had warnings:\nWARNINGS: - Extra text detected after JSON object\n\n"
                "root@c0ffee:/app# ls\nhello.txt",
            ),
            OK2,
        ),
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


def judge_in_sql(rules: FilterRules, trajectories: list[Trajectory], batch_trajectories: int = 1_000) -> list[Verdict]:
    """The SQL forms' verdicts, as `Verdict`s in the Python form's shape (turn drops in rule
    order, then turn order), from a fresh in-memory store holding `trajectories`."""
    with Store(":memory:") as store:
        con = store.connection
        ids = [f"t{position:06d}" for position in range(len(trajectories))]
        _insert(con, ids, trajectories)
        judge_unjudged(con, rules, batch_trajectories)
        order = {rule.name: position for position, rule in enumerate(rules.turn_rules)}
        drops: dict[str, list] = {}
        for trajectory_id, index, rule, reason in con.execute(f"SELECT * FROM {TURN_DROPS}").fetchall():
            drops.setdefault(trajectory_id, []).append((index, rule, reason))
        outcomes = {
            row[0]: row[1:]
            for row in con.execute(f"SELECT trajectory_id, kept, rule, reason FROM {VERDICTS}").fetchall()
        }
        drop_judging_tables(con)
    verdicts = []
    for trajectory_id, trajectory in zip(ids, trajectories):
        turn_drops = sorted(drops.get(trajectory_id, []), key=lambda drop: (order[drop[1]], drop[0]))
        removed = {index for index, _, _ in turn_drops}
        kept, rule, reason = outcomes[trajectory_id]
        verdicts.append(
            Verdict(
                kept,
                [index for index in range(len(trajectory.turns)) if index not in removed],
                turn_drops,
                None if kept else (rule, reason),
            )
        )
    return verdicts


def _json(value: Any) -> str | None:
    """As ingest stores JSON columns."""
    return orjson.dumps(value).decode() if value else None


def _insert(con: duckdb.DuckDBPyConnection, ids: list[str], trajectories: list[Trajectory]) -> None:
    con.register(
        "new_trajectories",
        pa.table(
            {
                "trajectory_id": ids,
                "domain": [t.domain for t in trajectories],
                "tools": pa.array([_json(t.system.tools) for t in trajectories], pa.string()),
                "num_turns": [len(t.turns) for t in trajectories],
            }
        ),
    )
    owners = [(trajectory_id, index) for trajectory_id, t in zip(ids, trajectories) for index in range(len(t.turns))]
    turns = [turn for t in trajectories for turn in t.turns]
    con.register(
        "new_turns",
        pa.table(
            {
                "trajectory_id": pa.array([owner for owner, _ in owners], pa.string()),
                "turn_index": pa.array([index for _, index in owners], pa.int32()),
                "action": pa.array([u.action for u in turns], pa.string()),
                "observation": pa.array([u.observation for u in turns], pa.string()),
                "tool_name": pa.array([u.tool_name for u in turns], pa.string()),
                "is_error": pa.array([u.is_error for u in turns], pa.bool_()),
                "metadata": pa.array([_json(u.metadata) for u in turns], pa.string()),
            }
        ),
    )
    con.execute(
        "INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, tools, num_turns, location, "
        "ingested_at) SELECT trajectory_id, 'test', 'simulacra-jsonl', domain, 'simulate', tools, num_turns, 'test', now() "
        "FROM new_trajectories"
    )
    con.execute("INSERT INTO turns SELECT * FROM new_turns")
    con.unregister("new_trajectories")
    con.unregister("new_turns")


@pytest.mark.parametrize(
    "overrides",
    list({repr(overrides): overrides for _, overrides, *_ in CASES}.values()),
    ids=repr,
)
def test_the_sql_form_decides_every_case_as_the_python_form(overrides):
    rules = build_rules(FilterConfig(**overrides))
    cases = [case for _, case_overrides, case, *_ in CASES if case_overrides == overrides]
    assert judge_in_sql(rules, cases, batch_trajectories=2) == [rules.judge(case) for case in cases]


def test_none_disables_by_not_building_the_rule():
    everything_off = FilterConfig(
        min_turns=None,
        check_action_space=None,
        environment_failure_patterns=None,
        harness_timeout_patterns=None,
        drop_empty_actions=None,
        malformed_action_patterns=None,
        gui_domains=None,
    )
    rules = build_rules(everything_off)
    assert rules.turn_rules == [] and rules.trajectory_rules == []
    defaults = build_rules(FilterConfig())
    assert [r.name for r in defaults.turn_rules] == ["empty_action", "retry_cycle", "gui_no_change"]
    assert [r.name for r in defaults.trajectory_rules] == [
        "min_turns",
        "action_space",
        "environment_failure",
        "harness_timeout",
    ]


def test_an_invalid_pattern_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"filter\.malformed_action_patterns.*pattern 1 \('\(unclosed'\)"):
        load_config(None, [{"filter": {"malformed_action_patterns": ["ok", "(unclosed"]}}])


def _screen_passes(screen: str, texts: list[str]) -> set[int]:
    """Positions of `texts` that DuckDB's `regexp_matches` (RE2) finds `screen` in."""
    rows = duckdb.sql(
        "SELECT position - 1 FROM unnest($texts) WITH ORDINALITY AS texts(text, position) WHERE regexp_matches(text, $screen)",
        params={"texts": texts, "screen": screen},
    ).fetchall()
    return {position for (position,) in rows}


@pytest.mark.parametrize(
    ("pattern", "passes", "fails"),
    [
        # \b is left out: "écaptcha" passes the screen, and `re` then says no.
        (r"(?i)\bcaptcha\b", ["a CAPTCHA", "\u00e9captcha", "captchas"], ["capt cha", "captch"]),
        (
            r"(?i)\b(HTTP|status)[ /]?(1\.[01] )?(500|502|503|504)\b",
            ["\u017ftatus 503", "HTTP/1.1 502", "status5040"],
            ['"status": "ok"', "HTTP 200", "HTTP/1.2 503"],
        ),
        (
            r"(?i)^\s*(error: )?invalid action",
            ["\u3000 \u0130nvalid action", "ERROR: INVALID ACTION", "\x1c\u0131nvalid action"],
            ["tests say: invalid action", "\u200binvalid action"],
        ),
        (r"Traceback(?i: \(most)", ["Traceback (MO\u017fT"], ["traceback (most"]),
        (r"\bE\d{3}\b", ["E042", "E\u0663\u0664\u0665", "Exyz"], ["E4", "e042"]),  # \d: any character
        (r"(a)b\1", ["aba", "abz"], ["ba"]),  # a backreference: anything at all
        (r"(?s)a.b", ["a\nb"], ["ab"]),
        (r"a.b", ["a-b"], ["a\nb"]),
        (r"[^\s]x", ["yx", "\nyx"], [" x", "\u3000x", "x"]),
        (r"(?i)[a-f]x", ["Cx", "bX"], ["gx"]),
        (r"(?i)[h-j]", ["\u0130", "\u0131", "J"], ["g"]),
        (r"(?i)\u0345", ["\u03b9", "x"], []),  # a non-ASCII character folded: any character
        (r"x{2000}", ["x" * 2000], ["x" * 999]),
        (r"(?=abc)ab(?!d)", ["abd"], ["ac"]),
    ],
)
def test_the_screen_rewrites_a_pattern_into_a_wider_re2_one(pattern, passes, fails):
    screen = re2_superset(pattern)
    assert screen is not None
    assert _screen_passes(screen, passes + fails) == set(range(len(passes)))


def random_pattern(rng: random.Random, depth: int = 0) -> str:
    atoms = [
        "a",
        "i",
        "I",
        "k",
        "s",
        "S",
        "K",
        "\u017f",
        "\u0130",
        "\u0131",
        "\u212a",
        "\u00e9",
        "\u03b9",
        "-",
        " ",
        ":",
        r"\.",
        r"\n",
        ".",
        r"\s",
        r"\S",
        r"\d",
        r"\w",
        r"\W",
        r"\b",
        r"\B",
        "^",
        "$",
        r"\A",
        r"\Z",
        "[a-f]",
        "[^ab]",
        r"[\s]",
        r"[^\s]",
        "[\u0131k]",
        "[A-Z]",
        r"[^\S]",
        "[^a-z]",
        "[\u00e0-\u00ff]",
    ]
    parts = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if depth < 2 and roll < 0.25:
            opener = rng.choice(["(", "(?:", "(?i:", "(?-i:", "(?s:", "(?=", "(?!", "(?>"])
            inner = "|".join(random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
            parts.append(opener + inner + ")")
        elif roll < 0.3:
            parts.append(r"\1")
        else:
            parts.append(rng.choice(atoms))
        if rng.random() < 0.3:
            parts[-1] += rng.choice(["*", "+", "?", "{1,3}", "*?", "{2}", "++"])
    flags = rng.choice(["", "", "(?i)", "(?s)", "(?m)", "(?a)", "(?is)", "(?ai)"])
    return flags + "".join(parts)


def test_the_screen_passes_every_text_re_matches():
    """Random patterns from `re`'s hard parts (case folds, Unicode classes, assertions, flags,
    backreferences) against random texts from the same characters: whatever `re.search` finds,
    the RE2 screen passes."""
    rng = random.Random(7)
    alphabet = "aiIksSKx\u017f\u0130\u0131\u212a\u00e9\u03b9\u0345 \u3000\x1c\n-:.09E"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10))) for _ in range(400)]
    checked = 0
    for _ in range(400):
        pattern = random_pattern(rng)
        try:
            compiled = re.compile(pattern)
        except re.error:
            continue
        matching = {position for position, text in enumerate(texts) if compiled.search(text)}
        screen = re2_superset(pattern)
        assert screen is not None, pattern
        assert matching <= _screen_passes(screen, texts), pattern
        checked += len(matching)
    assert checked > 10_000


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
    """DuckDB's RE2 runs the screen; `re` confirms the texts that pass."""
    patterns = PatternSet(SCREEN_PATTERNS)
    assert patterns.screen is not None
    expected = {}
    for position, text in enumerate(SCREEN_TEXTS):
        for pattern in SCREEN_PATTERNS:
            if re.search(pattern, text):
                expected[position] = pattern
                break
    passing = duckdb.sql(
        "SELECT position - 1 FROM unnest(?) WITH ORDINALITY AS texts(text, position) WHERE regexp_matches(text, ?)",
        params=[SCREEN_TEXTS, patterns.screen],
    ).fetchall()
    found = {position: patterns.first_match(SCREEN_TEXTS[position]) for (position,) in passing}
    assert {position: pattern for position, pattern in found.items() if pattern} == expected
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


def test_python_whitespace_is_what_str_isspace_and_re_accept():
    every_char = "".join(chr(c) for c in range(sys.maxunicode + 1))
    assert PYTHON_WHITESPACE == "".join(char for char in every_char if char.isspace())
    assert PYTHON_WHITESPACE == "".join(re.findall(r"\s", every_char))


# The hard parts of the cases above, to draw random trajectories from.
ACTIONS = ["ls", "click [3]", "", " ", "\t\n", "\u3000", "\x1c", "\x85", "\xa0 ", "\u200b", "\x1f x", "type 'hi'"]
OBSERVATIONS = [
    A_SCREEN,
    A_SCREEN_REINDENTED,
    ANOTHER_SCREEN,
    A_SCREEN + "\u2028",
    "\x1c" + A_SCREEN.replace(" ", "\u3000"),
    A_SCREEN.replace(" ", "\u200b"),  # a zero-width space is not whitespace: another screen
    A_SCREEN.replace("\n", " \r\n\u3000 "),
    "\n" + A_SCREEN + "\n\n",
    "",
    " \n ",
    "file.txt",
    "Error: invalid action format, expected one bash command",
    "ERROR: INVALID ACTION",
    "\u0130nvalid action",  # dotted capital I folds to i in re, not in RE2
    "\u0131nvalid command",  # so does the dotless i
    "  malformed json",
    "tests say: invalid action is rejected",
    "Unknown tool 'bogus'",
    "un\u212anown tool",  # the Kelvin sign folds to k
    "Your response was not formatted correctly.",
    "HTTP/1.1 503",
    "\u017ftatus 502",  # the long s folds to s
    "Please verify you are a human",
    "\u00e9captcha",  # no word boundary before the c for re (RE2 would see one)
    "a captcha!",
    "captcha".ljust(40, "."),
    "captcha".ljust(41, "."),
    "Container crashed",
    "state file corrupted",
    "fatal E042 reached",
    "oops: try again",
    "\nEXECUTION TIMED OUT",
    LONG_OUTPUT + OPENHANDS_HARD_TIMEOUT,
    "Previous response had parsing errors:\nERROR: No valid JSON found in response",
]
TOOL_NAMES = [None, None, "search", "open_page", "delete_all", "it's", 'say "hi"', "new\nline", "\u00e9t\u00e9", "x"]
TOOL_LISTS = [
    [],
    SEARCH_TOOLS,
    [{"type": "function", "function": {"name": "x"}}, {"name": "it's"}],
    [{"function": None, "name": "search"}],  # "function" present but not a tool: declares nothing
    [{"name": 5}, "search"],
    [{"name": "search"}, {"name": "search"}],
]
METADATA = [{}, {}, {"kind": "format_error"}, {"kind": "other"}, {"kind": ["format_error"]}, {"note": "format_error"}]
DOMAINS = ["terminal", "web", "android", "mcp", "os", "text-game"]
CONFIGS = [
    {},
    {"min_turns": 3, "gui_domains": ["terminal", "web"], "environment_failure_max_chars": 40},
    {"drop_empty_actions": False, "check_action_space": False},
    {"malformed_action_patterns": None, "gui_domains": []},
    {
        # \d has no exact RE2 spelling, and RE2 refuses the last pattern: no screen, every
        # observation is searched with re
        "environment_failure_patterns": [r"\bE\d{3}\b", r"(?i)captcha", r"(?:x{1000}){1000}"],
        "malformed_action_patterns": [r"(?i)^\s*oops", r"^\s*$"],
        "min_turns": None,
    },
    {
        "min_turns": None,
        "check_action_space": None,
        "environment_failure_patterns": None,
        "harness_timeout_patterns": None,
        "drop_empty_actions": None,
        "malformed_action_patterns": None,
        "gui_domains": None,
    },
]


def random_trajectory(rng: random.Random) -> Trajectory:
    domain = rng.choice(DOMAINS)
    # GUI screens repeat often, so no-change runs, and runs broken by a removed turn, are common.
    observations = OBSERVATIONS[:8] * 4 + OBSERVATIONS if domain in ("web", "android", "os") else OBSERVATIONS
    turns = [
        Turn(
            rng.choice(ACTIONS[:2] * 6 + ACTIONS),
            rng.choice(observations),
            rng.choice(TOOL_NAMES),
            rng.random() < 0.3,
            rng.choice(METADATA),
        )
        for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4, 5, 6, 8]))
    ]
    return Trajectory(
        source="random", domain=domain, turns=turns, system=SystemPrompt("simulate", tools=rng.choice(TOOL_LISTS))
    )


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda overrides: ",".join(overrides) or "defaults")
def test_the_sql_form_decides_random_trajectories_as_the_python_form(overrides):
    rules = build_rules(FilterConfig(**overrides))
    trajectories = [random_trajectory(random.Random(seed)) for seed in range(3_000)]
    python = [rules.judge(t) for t in trajectories]
    sql = judge_in_sql(rules, trajectories, batch_trajectories=700)
    for trajectory, expected, found in zip(trajectories, python, sql):
        assert found == expected, trajectory
    # Not vacuous: every rule built decides something (but a GUI rule without GUI domains).
    decided = Counter(rule for v in python for _, rule, _ in v.turn_drops)
    decided.update(v.trajectory_drop[0] for v in python if v.trajectory_drop)
    assert set(decided) == {rule.name for rule in rules.all} - (
        {"gui_no_change"} if overrides.get("gui_domains") == [] else set()
    )


def test_screens_too_large_to_run_as_one_are_run_one_by_one():
    """Each rule's screen fits RE2's program limit, their alternation does not."""
    large = r"(?i)(?:" + "abcdefghijklmnopqrstuvwxyz" * 16 + "){1000}"
    rules = build_rules(
        FilterConfig(
            environment_failure_patterns=[large, r"(?i)\bcaptcha\b"], malformed_action_patterns=[large, r"^oops"]
        )
    )
    assert all(rule.searched.screen is not None for rule in rules.all if rule.searched is not None)
    cases = [
        trajectory(OK, turn("open", "a CAPTCHA"), OK2),
        trajectory(OK, turn("x", "oops"), OK2),
        trajectory(OK, OK2),
    ]
    verdicts = judge_in_sql(rules, cases)
    assert verdicts == [rules.judge(case) for case in cases]
    assert [v.kept for v in verdicts] == [False, True, True] and verdicts[1].turn_drops[0][1] == "retry_cycle"
