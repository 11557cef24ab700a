"""Inferring a trajectory's domain (SPEC.md's list) from what its agent called and saw.

Used only when the source does not name its domain. A domain is recognised by a signature tool:
the first domain in `SIGNATURE_TOOLS` order with a matching tool name anywhere in the trajectory
wins, so an editor tool makes a run SWE even though most of its calls are `bash`, and a web-search
tool makes a research run `search` even when it also executes code. Tool calls with no signature
(an airline's `get_user_details`) are the MCP domain, the adapter's default.
"""

import re
from collections.abc import Iterable

# Whole-name patterns, matched case-insensitively; `_`, `-`, `.` and `/` separate name parts.
SIGNATURE_TOOLS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("swe", re.compile(r"str_replace_editor|str_replace_based_edit_tool|file_editor|edit_file|apply_patch")),
    ("android", re.compile(r"(^|[_.\-/])(adb|android|tap|swipe|long_press)($|[_.\-/])")),
    ("web", re.compile(r"(^|[_.\-/])(browser|browse|click|goto|navigate|scroll|hover|open_url|playwright)($|[_.\-/])")),
    # "search" alone is too broad (`search_direct_flight` is an airline API): the paper's search
    # domain is a search engine, so only web/engine searches count.
    (
        "search",
        re.compile(r"^(search|web_search|search_web|google_search|bing_search|wikipedia_search|search_engine)$"),
    ),
    ("terminal", re.compile(r"(^|[_.\-/])(bash|shell|terminal|sh|zsh|execute|exec|run_command|tmux)($|[_.\-/])")),
)

# ALFWorld's task line ("Your task is to: put some spraybottle on toilet.") and its opening room
# description; TextWorld's banner. Either marks a text game whatever the harness called its tool.
TASK_LINE = re.compile(r"^Your task is to: *(.+?) *$", re.MULTILINE)
TEXT_GAME_OPENINGS = re.compile(r"You are in the middle of a room\.|-= Welcome to TextWorld =-")


def domain_of_tools(tool_names: Iterable[str | None], default: str) -> str:
    names = [name.lower() for name in tool_names if name]
    for domain, signature in SIGNATURE_TOOLS:
        if any(signature.search(name) for name in names):
            return domain
    return default


def is_text_game(observation: str | None) -> bool:
    if not observation:
        return False
    return bool(TASK_LINE.search(observation) or TEXT_GAME_OPENINGS.search(observation))


def task_line(observation: str) -> str | None:
    """The text game's goal, from its `Your task is to:` line, if the observation has one."""
    match = TASK_LINE.search(observation)
    return match.group(1) if match else None
