"""flawed.jsonl: records built to fail, one per quarantine or filter path, so a demo run shows each
path taken. The tool responses in them come from the live bookstore service."""

import json

from pipeline.environments.bookstore import TOOLS, TOOLS_BY_NAME, Bookstore
from pipeline.environments.terminal import terminal_system
from pipeline.formats.simulacra_jsonl import to_record
from pipeline.store.schema import SystemPrompt, Trajectory, Turn

from . import SOURCE, jsonl_line
from .terminal import shell_turn

# ---------------------------------------------------------------------------------------------
# FLAWED RECORDS: data/demo/flawed.jsonl, one line each, in this order. Each exercises one path
# of ingestion or filtering (SPEC.md "Filtering"); tests/test_demo_corpus.py holds the same table.
#   1. Invalid JSON (a record cut off mid-line)        -> quarantined at ingest: "invalid JSON".
#   2. A turn whose observation is a number            -> quarantined: "turns[1].observation: expected a string".
#   3. A trajectory of a single turn                   -> filter min_turns (fewer than 2 turns).
#   4. Tool calls to `delete_customer`, not declared   -> filter action_space.
#   5. Terminal run whose container crashed            -> filter environment_failure ("container crashed").
#   6. Tool call answered by a 503 error page          -> filter environment_failure (HTTP error page).
#   7. Terminal command that hit the harness timeout   -> filter environment_failure ("command timed out").
#   8. Tool call with unparseable JSON arguments, answered "Invalid action: ..." by the harness,
#      then the corrected call                         -> kept; turn 1 dropped by retry_cycle.
#   9. Call to a misspelt tool answered "Error: unknown tool ...", then the right tool
#                                                      -> kept; turn 0 dropped by retry_cycle, so
#                                                         action_space sees no undeclared tool.
#  10. A reply with no bash command, flagged `kind: format_error` by its harness, then the command
#                                                      -> kept; turn 0 dropped by retry_cycle.
#  11. A turn whose action is empty                    -> kept; that turn dropped by empty_action.
# ---------------------------------------------------------------------------------------------


def tool_action(name: str, arguments: object) -> str:
    return json.dumps({"name": name, "arguments": arguments})


def mcp_turn(store: Bookstore, name: str, **arguments: object) -> Turn:
    result = store.call(name, arguments)
    return Turn(tool_action(name, arguments), json.dumps(result), tool_name=name, is_error="error" in result)


def mcp_system() -> SystemPrompt:
    return SystemPrompt(
        task_description="You are simulating the Inkwell Books support API. Given a tool call, return the JSON the "
        "service would return, errors included.",
        action_space='Tool calls: a JSON object {"name": tool, "arguments": {...}} naming one of the declared tools.',
        tools=TOOLS,
    )


def flawed_lines() -> list[str]:
    store = Bookstore()
    files = {"logs/app.log": "2024-03-02T10:00:00Z INFO  [api] started\n", "notes.txt": "todo\n"}
    terminal = terminal_system(files)

    def record(domain: str, task: str, system: SystemPrompt, turns: list[Turn], flaw: str) -> dict:
        trajectory = Trajectory(
            source=SOURCE, domain=domain, task=task, system=system, turns=turns, metadata={"flaw": flaw}
        )
        return to_record(trajectory)

    cut = jsonl_line(
        record(
            "terminal",
            "List the logs.",
            terminal,
            [
                shell_turn("ls -1 logs", "app.log\n"),
                shell_turn("wc -l logs/app.log", "1 logs/app.log\n"),
            ],
            "invalid_json",
        )
    )
    wrong_type = record(
        "terminal",
        "Count log lines.",
        terminal,
        [
            shell_turn("ls -1 logs", "app.log\n"),
            shell_turn("wc -l < logs/app.log", "1\n"),
        ],
        "observation_not_text",
    )
    wrong_type["turns"][1]["observation"] = 1
    single = record(
        "terminal",
        "Show the notes.",
        terminal,
        [
            shell_turn("cat notes.txt", "todo\n"),
        ],
        "single_turn",
    )
    undeclared = record(
        "mcp",
        "Remove customer C1004's account.",
        mcp_system(),
        [
            mcp_turn(store, "get_customer", customer_id="C1004"),
            Turn(
                tool_action("delete_customer", {"customer_id": "C1004"}),
                json.dumps({"deleted": True}),
                tool_name="delete_customer",
            ),
        ],
        "undeclared_tool",
    )
    crashed = record(
        "terminal",
        "Archive the logs.",
        terminal,
        [
            shell_turn("ls -1 logs", "app.log\n"),
            shell_turn(
                "tar -czf logs.tar.gz logs", "Error: container crashed (exit status 137); the session was lost.\n", 137
            ),
            shell_turn("ls -1", ""),
        ],
        "environment_crash",
    )
    unavailable = record(
        "mcp",
        "Find books by Tanaka.",
        mcp_system(),
        [
            mcp_turn(store, "search_books", query="Tanaka"),
            Turn(
                tool_action("get_book", {"book_id": "B104"}),
                "<html><head><title>503 Service Unavailable</title></head><body><h1>503 Service Unavailable</h1>"
                "<p>The server is temporarily unable to service your request.</p></body></html>",
                tool_name="get_book",
                is_error=True,
            ),
            mcp_turn(store, "get_book", book_id="B104"),
        ],
        "http_error_page",
    )
    timeout = record(
        "terminal",
        "Count lines in every file.",
        terminal,
        [
            shell_turn("ls -1", "logs\nnotes.txt\n"),
            shell_turn(
                "find / -type f | xargs wc -l",
                "Error: command timed out after 120 seconds; the process was killed.\n",
                124,
            ),
            shell_turn("wc -l notes.txt logs/app.log", "  1 notes.txt\n  1 logs/app.log\n  2 total\n"),
        ],
        "harness_timeout",
    )
    malformed = record(
        "mcp",
        "Check order O2003.",
        mcp_system(),
        [
            mcp_turn(store, "get_customer", customer_id=store.orders["O2003"]["customer_id"]),
            Turn(
                '{"name": "get_order", "arguments": {order_id: O2003',
                "Invalid action: the tool call arguments are not valid JSON (Expecting property name enclosed in double "
                "quotes: line 1 column 2 (char 1)). Send one JSON object.",
                is_error=True,
            ),
            mcp_turn(store, "get_order", order_id="O2003"),
        ],
        "retry_malformed_arguments",
    )
    unknown_tool = record(
        "mcp",
        "Where is order O2005?",
        mcp_system(),
        [
            Turn(
                tool_action("get_ordr", {"order_id": "O2005"}),
                "Error: unknown tool 'get_ordr'. Available tools: " + ", ".join(sorted(TOOLS_BY_NAME)) + ".",
                tool_name="get_ordr",
                is_error=True,
            ),
            mcp_turn(store, "get_order", order_id="O2005"),
            mcp_turn(store, "list_orders", customer_id=store.orders["O2005"]["customer_id"]),
        ],
        "retry_unknown_tool",
    )
    no_block = record(
        "terminal",
        "How many lines does the log have?",
        terminal,
        [
            Turn(
                "I will count the lines of the log file now.",
                "Your reply did not contain a command. Reply with exactly one bash code block.",
                is_error=True,
                metadata={"kind": "format_error"},
            ),
            shell_turn("wc -l logs/app.log", "1 logs/app.log\n"),
            shell_turn("tail -n 1 logs/app.log", files["logs/app.log"]),
        ],
        "retry_format_error",
    )
    empty = record(
        "terminal",
        "Show the log.",
        terminal,
        [
            shell_turn("ls -1 logs", "app.log\n"),
            shell_turn("", ""),
            shell_turn("cat logs/app.log", files["logs/app.log"]),
        ],
        "empty_action",
    )
    return [cut[: len(cut) // 2] + "\n"] + [
        jsonl_line(r)
        for r in (
            wrong_type,
            single,
            undeclared,
            crashed,
            unavailable,
            timeout,
            malformed,
            unknown_tool,
            no_block,
            empty,
        )
    ]
