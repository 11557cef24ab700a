"""The bundled demo corpus (data/build_demo_corpus.py, built by data/demo_builder/, -> data/demo):
rebuilt byte for byte, the committed copy equal to a fresh build, counts and turn ranges as
documented, every record readable, and each deliberately flawed record caught for the reason it
was made for."""

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline.config.filter import FilterConfig
from pipeline.filters import build_rules
from pipeline.formats import detect
from pipeline.formats.base import Malformed, iter_documents
from pipeline.formats.simulacra_jsonl import Adapter
from pipeline.formats.sources import expand
from pipeline.store.schema import RecordError

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "data" / "build_demo_corpus.py"
COMMITTED = ROOT / "data" / "demo"
WORLD_KNOWLEDGE = ROOT / "data" / "world_knowledge"
# The only file whose bytes depend on the machine as well as the script: bash, coreutils and
# Python word their messages by version, and terminal_env.md records the versions used.
MACHINE_DEPENDENT = "terminal.jsonl"


def run_builder(out: Path) -> Path:
    # Run from outside the repository: the script must not depend on the working directory.
    result = subprocess.run(
        [sys.executable, str(BUILDER), "--out", str(out)], cwd=out.parent, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"builder failed:\n{result.stderr}"
    return out


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# A build takes about ten seconds, so the module makes one, and a second only where it must.
@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict[str, bytes]:
    return tree(run_builder(tmp_path_factory.mktemp("fresh") / "demo"))


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> dict[str, bytes]:
    return tree(run_builder(tmp_path_factory.mktemp("second") / "demo"))


def jsonl_records(path: Path, first_line: int = 1) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[first_line - 1 :]]


def test_rebuild_is_byte_identical(fresh, request):
    """Two runs give the same bytes. The committed corpus is an earlier run: where it equals the
    fresh build in every file (terminal.jsonl too, so the tool versions match), the two runs are
    compared already. Otherwise (other tool versions, or a stale commit, which the next tests
    report) a second build tells nondeterminism apart."""
    if tree(COMMITTED) == fresh:
        return
    second = request.getfixturevalue("second")
    assert sorted(fresh) == sorted(second)
    differing = [name for name in fresh if fresh[name] != second[name]]
    assert differing == []


def test_committed_corpus_is_a_fresh_build(fresh):
    committed = tree(COMMITTED)
    assert sorted(committed) == sorted(fresh), "files added or missing: rebuild with data/build_demo_corpus.py"
    differing = [name for name in fresh if name != MACHINE_DEPENDENT and committed[name] != fresh[name]]
    assert differing == [], "edited by hand or stale: rebuild with data/build_demo_corpus.py"


def test_committed_terminal_runs_are_a_fresh_build(fresh):
    if (COMMITTED / "terminal_env.md").read_bytes() != fresh["terminal_env.md"]:
        pytest.skip(
            "this machine's bash/coreutils/Python differ from the committed build's (terminal_env.md), "
            "so their messages may too; the other files were compared"
        )
    assert (COMMITTED / MACHINE_DEPENDENT).read_bytes() == fresh[MACHINE_DEPENDENT]


def terminal_turns() -> list[int]:
    return [len(r["turns"]) for r in jsonl_records(COMMITTED / "terminal.jsonl")]


def tool_call_turns() -> list[int]:
    conversations = json.loads((COMMITTED / "tool_calls.json").read_text())
    return [sum(len(m.get("tool_calls") or []) for m in c["messages"]) for c in conversations]


def text_game_turns() -> list[int]:
    return [
        sum(line.startswith("> ") for line in p.read_text().splitlines())
        for p in sorted((COMMITTED / "text_games").glob("*.txt"))
    ]


@pytest.mark.parametrize(
    ("domain", "turns_of", "trajectories", "turns"),
    [
        ("terminal", terminal_turns, (100, 140), (4, 14)),
        ("mcp", tool_call_turns, (100, 140), (3, 10)),
        ("text-game", text_game_turns, (80, 120), (6, 20)),
    ],
)
def test_counts_per_domain(domain, turns_of, trajectories, turns):
    counts = turns_of()
    assert trajectories[0] <= len(counts) <= trajectories[1], domain
    assert turns[0] <= min(counts) and max(counts) <= turns[1], domain


def test_the_adapters_read_every_record_but_the_two_broken_ones():
    """The folder as `simulacra ingest data/demo` sees it: each file detected, each record parsed,
    no two trajectories the same (the store keys them by content, so a repeat would be lost)."""
    domains: dict[str, int] = {}
    failures, ids = [], set()
    for source in expand(str(COMMITTED)):
        documents = list(source.documents())
        adapter = detect(next(d for d in documents if not isinstance(d, Malformed)).content)
        assert adapter is not None, source.path
        for document in documents:
            if isinstance(document, Malformed):
                failures.append(document.location)
                continue
            for record in adapter.records(document):
                try:
                    trajectory = adapter.parse(record.content, None)
                except RecordError:
                    failures.append(record.location)
                    continue
                ids.add(trajectory.content_id())
                domains[trajectory.domain] = domains.get(trajectory.domain, 0) + 1
    assert [Path(location).name for location in failures] == ["flawed.jsonl:1", "flawed.jsonl:2"]
    # Every run of the three environments, plus the flawed records that parse (lines 3 onwards).
    expected = {"terminal": len(terminal_turns()), "mcp": len(tool_call_turns()), "text-game": len(text_game_turns())}
    for record in jsonl_records(COMMITTED / "flawed.jsonl", first_line=3):
        expected[record["domain"]] += 1
    assert domains == expected
    assert len(ids) == sum(domains.values())


def test_corpus_stays_small():
    assert sum(len(content) for content in tree(COMMITTED).values()) < 2_000_000


def test_terminal_observations_hide_the_temporary_directory():
    observations = [t["observation"] for r in jsonl_records(COMMITTED / "terminal.jsonl") for t in r["turns"]]
    temporary = tempfile.gettempdir().rstrip("/") + "/"
    leaks = [o for o in observations if "simulacra-demo-" in o or temporary in o]
    assert leaks == []
    # The replacement did happen: tracebacks and error messages name files under the fake home.
    assert any("/home/user/work/" in o for o in observations)


def test_terminal_records_parse_and_pass_the_filters():
    adapter, rules = Adapter(), build_rules(FilterConfig())
    for number, record in enumerate(jsonl_records(COMMITTED / "terminal.jsonl"), start=1):
        trajectory = adapter.parse(record, None)
        verdict = rules.judge(trajectory)
        assert trajectory.domain == "terminal"
        assert verdict.kept and verdict.turn_drops == [], f"terminal.jsonl:{number}: {verdict}"


# flawed.jsonl line -> what must happen to it: quarantine with a message, a trajectory drop by a
# rule, or kept with the listed (turn, rule) removals. Same order as the FLAWED RECORDS comment in
# data/demo_builder/flawed.py.
FLAWED = [
    (1, "quarantine", "invalid JSON"),
    (2, "quarantine", "turns[1].observation: expected a string"),
    (3, "dropped", "min_turns"),
    (4, "dropped", "action_space"),
    (5, "dropped", "environment_failure"),
    (6, "dropped", "environment_failure"),
    (7, "dropped", "environment_failure"),
    (8, "kept", [(1, "retry_cycle")]),
    (9, "kept", [(0, "retry_cycle")]),
    (10, "kept", [(0, "retry_cycle")]),
    (11, "kept", [(1, "empty_action")]),
]


def test_flawed_records_are_all_listed():
    assert len((COMMITTED / "flawed.jsonl").read_text().splitlines()) == len(FLAWED)


@pytest.mark.parametrize(("line", "outcome", "expected"), FLAWED)
def test_flawed_record_is_caught_for_its_reason(line, outcome, expected):
    document = list(iter_documents(COMMITTED / "flawed.jsonl"))[line - 1]
    if isinstance(document, Malformed):
        assert (outcome, document.location.endswith(f":{line}")) == ("quarantine", True)
        assert expected in document.error
        return
    try:
        trajectory = Adapter().parse(document.content, None)
    except RecordError as error:
        assert outcome == "quarantine"
        assert expected in str(error)
        return
    verdict = build_rules(FilterConfig()).judge(trajectory)
    if outcome == "dropped":
        assert not verdict.kept and verdict.trajectory_drop[0] == expected
    else:
        assert outcome == "kept" and verdict.kept
        assert [(turn, rule) for turn, rule, _ in verdict.turn_drops] == expected


def test_tool_calls_are_openai_chat():
    conversations = json.loads((COMMITTED / "tool_calls.json").read_text())
    for index, conversation in enumerate(conversations):
        where = f"tool_calls.json[{index}]"
        assert sorted(conversation) == ["messages", "tools"], where
        declared = set()
        for tool in conversation["tools"]:
            assert tool["type"] == "function" and tool["function"]["parameters"]["type"] == "object", where
            declared.add(tool["function"]["name"])
        messages = conversation["messages"]
        assert messages[0]["role"] == "system" and messages[1]["role"] == "user", where
        assert messages[-1]["role"] == "assistant" and isinstance(messages[-1]["content"], str), where
        position = 0
        while position < len(messages):
            message = messages[position]
            assert message["role"] in ("system", "user", "assistant"), f"{where}: unanswered tool reply at {position}"
            calls = message.get("tool_calls") or []
            replies = messages[position + 1 : position + 1 + len(calls)]
            for call, reply in zip(calls, replies, strict=True):
                assert call["type"] == "function" and call["function"]["name"] in declared, where
                assert isinstance(json.loads(call["function"]["arguments"]), dict), where
                assert reply["role"] == "tool", where
                assert (reply["tool_call_id"], reply["name"]) == (call["id"], call["function"]["name"]), where
                json.loads(reply["content"])
            position += 1 + len(calls)


def test_tool_calls_include_errors_and_pagination():
    contents = [
        json.loads(m["content"])
        for c in json.loads((COMMITTED / "tool_calls.json").read_text())
        for m in c["messages"]
        if m["role"] == "tool"
    ]
    errors = {c["error"]["code"] for c in contents if "error" in c}
    assert {"not_found", "insufficient_stock", "invalid_arguments", "invalid_status", "invalid_page"} <= errors
    assert any(c.get("page", 1) > 1 for c in contents)


def test_text_game_logs_have_the_harness_layout():
    for path in sorted((COMMITTED / "text_games").glob("*.txt")):
        lines = path.read_text().splitlines()
        assert lines[0].startswith("You are in the middle of a room."), path.name
        assert lines[1].startswith("Your task is to: "), path.name
        # After the header, lines alternate: "> action", then the observation it produced.
        actions, observations = lines[2::2], lines[3::2]
        assert len(actions) == len(observations), path.name
        assert all(a.startswith("> ") and len(a) > 2 for a in actions), path.name
        assert all(o and not o.startswith("> ") for o in observations), path.name


def test_world_knowledge_documents_cover_the_cpt_domains():
    documents = sorted(WORLD_KNOWLEDGE.glob("*.txt"))
    assert 12 <= len(documents) <= 20
    areas = {re.match(r"(law|medicine|finance|security|industry|current_affairs)_", p.name).group(1) for p in documents}
    assert areas == {"law", "medicine", "finance", "security", "industry", "current_affairs"}
    for path in documents:
        words = len(path.read_text(encoding="utf-8").split())
        assert 150 <= words <= 700, f"{path.name}: {words} words"
