"""The SQL fast path for simulacra JSONL stores exactly what the Python adapter stores.

The Python adapter is the specification: every file here is ingested twice, once with the fast
path and once with `ingest.sql_fast_path: false`, and the two stores must hold the same rows
(trajectories, turns, quarantine with reasons and locations, file progress) and report the same
counts. Where the test expects the fast path to vouch for a line itself, it also checks that the
line never reached the Python adapter, so a fast path that routed everything could not pass.
"""

import json
import random
from pathlib import Path

import duckdb
import orjson
import pytest

from pipeline.config import load_config
from pipeline.errors import interrupted
from pipeline.formats import adapter, jsonl_lines
from pipeline.formats import simulacra_jsonl_sql as jsonl_sql
from pipeline.formats.simulacra_jsonl import to_record
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import ingest

DEMO_TOOL_CALLS = Path(__file__).resolve().parents[1] / "data" / "demo" / "tool_calls.json"


def stored(store: Store) -> dict[str, list]:
    return {
        "trajectories": store.execute(
            "SELECT * EXCLUDE (ingested_at) FROM trajectories ORDER BY trajectory_id"
        ).fetchall(),
        "turns": store.execute("SELECT * FROM turns ORDER BY trajectory_id, turn_index").fetchall(),
        "quarantine": store.execute("SELECT * EXCLUDE (recorded_at) FROM quarantine ORDER BY quarantine_id").fetchall(),
        "files": store.execute("SELECT * EXCLUDE (updated_at) FROM ingested_files ORDER BY path").fetchall(),
    }


def ingest_both(tmp_path: Path, monkeypatch, path: Path, **settings) -> tuple[dict, dict, list[str]]:
    """Ingest `path` with each reader into its own store; returns both stores' rows and the
    locations the fast path handed to the Python adapter."""
    results, routed = {}, []
    real_parse = ingest._parse
    for reader in ("sql", "python"):
        config = load_config(
            None,
            [{"workspace": {"path": str(tmp_path / reader)}, "ingest": {**settings, "sql_fast_path": reader == "sql"}}],
        )
        parsed: list[str] = []
        monkeypatch.setattr(
            ingest,
            "_parse",
            lambda record, *a: parsed.append(record.location) or real_parse(record, *a),  # noqa: B023 - replaced next iteration
        )
        with Store(config.workspace.database_path) as store:
            metrics = ingest.run(config, store, paths=[str(path)]).metrics
            results[reader] = {**stored(store), "metrics": metrics}
        if reader == "sql":
            routed = parsed
    monkeypatch.setattr(ingest, "_parse", real_parse)
    return results["sql"], results["python"], routed


def write_lines(path: Path, lines: list[str | bytes], newline: bytes = b"\n") -> Path:
    path.write_bytes(newline.join(line if isinstance(line, bytes) else line.encode() for line in lines) + newline)
    return path


TRICKY_TEXT = [
    "plain ASCII",
    "",
    "naïve café, Ærøskøbing, 東京, Ελληνικά, עברית",
    "emoji 😀👨‍👩‍👧 and e\u0301 (combining)",
    "line one\nline two\r\nline three\ttabbed",
    "NUL \x00 inside, and \x01\x1f\x7f controls",
    'quotes " and \\ backslashes and \\" together',
    "\u2028\u2029 separators",
    'looks like JSON: {"a": 1, "b": [1, 2]}',  # not minified: still plain text
    "7 items",
    "true-ish",
    "x" * 5000,
]


def tricky_trajectory(n: int, rng: random.Random) -> Trajectory:
    def text() -> str:
        return rng.choice(TRICKY_TEXT) + f" {n}-{rng.random()}"

    turns = [
        Turn(
            action=text(),
            observation=text(),
            tool_name=rng.choice([None, "bash", "search_books", "ツール"]),
            is_error=rng.random() < 0.2,
            metadata=rng.choice([{}, {}, {"step": n, "why": text()}]),
        )
        for _ in range(rng.randint(1, 6))
    ]
    tools = rng.choice(
        [
            [],
            [
                {
                    "type": "function",
                    "function": {
                        "name": "search_books",
                        "description": text(),
                        "parameters": {"type": "object", "required": ["q"]},
                    },
                }
            ],
        ]
    )
    return Trajectory(
        source="",
        domain=rng.choice(["terminal", "mcp", "text-game", "other"]),
        turns=turns,
        system=SystemPrompt(
            task_description=text(),
            action_space=rng.choice([None, text()]),
            tools=tools,
            initial_state=rng.choice([None, text()]),
            demonstrations=rng.choice([None, text()]),
            simulation_instructions=rng.choice([None, text()]),
        ),
        task=rng.choice([None, text()]),
        outcome_reward=rng.choice([None, 0.0, 1.0, 0.25, -3.5]),
        metadata=rng.choice([{}, {"seed": n}, {"run": text(), "score": 0.5}]),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_trajectories_get_the_same_ids_and_rows_on_both_paths(tmp_path, monkeypatch, seed):
    """Property-style: random trajectories with tricky text, written as JSONL three ways (orjson,
    json with \\u escapes, json with raw UTF-8), read by both paths: the same rows, the fast path
    reads every line itself, and its ids are `Trajectory.content_id()` of what was written."""
    rng = random.Random(seed)
    trajectories = [tricky_trajectory(n, rng) for n in range(40)]
    writers = [
        lambda r: orjson.dumps(r).decode(),
        lambda r: json.dumps(r, ensure_ascii=True),
        lambda r: json.dumps(r, ensure_ascii=False, separators=(",", ":")),
    ]
    lines = [writers[n % 3](to_record(t)) for n, t in enumerate(trajectories)]
    path = write_lines(tmp_path / "random.jsonl", lines)
    fast, python, routed = ingest_both(tmp_path, monkeypatch, path, batch_trajectories=16)
    assert fast == python
    assert routed == [f"{path}:{n + 1}" for n, t in enumerate(trajectories) if metadata_with_controls(t)]
    assert {row[0] for row in fast["trajectories"]} == {t.content_id() for t in trajectories}


def metadata_with_controls(trajectory: Trajectory) -> bool:
    """DuckDB writes a control character as \\u001F, orjson as \\u001f: metadata holding one would
    be stored differently, so the fast path hands such lines to Python."""
    texts = [json.dumps(trajectory.metadata)] + [json.dumps(t.metadata) for t in trajectory.turns]
    return any(f"\\u00{code:02x}" in text for text in texts for code in range(32) if chr(code) not in "\b\f\n\r\t")


def test_demo_tool_calls_read_the_same_on_both_paths(tmp_path, monkeypatch):
    """Real tool schemas (nested JSON, descriptions) from the demo bookstore, as simulacra JSONL."""
    chat = adapter("openai-chat")
    records = json.loads(DEMO_TOOL_CALLS.read_text())
    lines = [orjson.dumps(to_record(chat.parse(record, None))).decode() for record in records]
    path = write_lines(tmp_path / "tool_calls.jsonl", lines)
    fast, python, routed = ingest_both(tmp_path, monkeypatch, path)
    assert fast == python
    assert fast["metrics"]["added"] == len(records)
    assert routed == [], "tool-call trajectories are the fast path's to read"


def turn(**fields) -> dict:
    return {"action": "ls", "observation": "a.txt\n", "tool_name": None, "is_error": False, **fields}


def line(**fields) -> str:
    record = {
        "schema": "simulacra/trajectory-v1",
        "domain": "terminal",
        "task": None,
        "system": {"task_description": "A shell."},
        "turns": [turn()],
        "outcome_reward": None,
        "metadata": {},
    }
    return json.dumps({**record, **fields})


# Lines DuckDB reads differently from orjson, or that are wrong for the adapter: (name, line,
# whether the fast path may vouch for it itself). Every one must end as the Python path ends it.
EDGE_LINES = [
    ("trailing comma", '{"schema": "simulacra/trajectory-v1", "turns": [{"action": "a", "observation": "b"},]}', False),
    ("NaN reward", line().replace('"outcome_reward": null', '"outcome_reward": NaN'), False),
    ("Infinity in an unknown key", line()[:-1] + ', "extra": Infinity}', False),
    ("huge exponent in metadata", line(metadata={"x": 1}).replace('"x": 1', '"x": 1e400'), False),
    (
        "big integer in metadata",
        line(metadata={"x": 1}).replace('"x": 1', '"x": 123456789012345678901234567890'),
        False,
    ),
    ("float forms in metadata", line(metadata={"x": 1}).replace('"x": 1', '"x": 1E5, "y": 0.1, "z": 1.5e-7'), True),
    ("control character in metadata", line(metadata={"x": "\x1f"}), False),
    ("deep nesting in an unknown key", line()[:-1] + ', "extra": ' + "[" * 1100 + "]" * 1100 + "}", False),
    (
        "deep nesting in metadata",
        line()[:-1].replace('"metadata": {}', '"metadata": {"d": ' + "[" * 1023 + "]" * 1023 + "}") + "}",
        False,
    ),
    ("duplicate top-level key", line()[:-1] + ', "task": "second"}', False),
    (
        "duplicate system key",
        line(system={"task_description": "A shell."}).replace('"A shell."}', '"A shell.", "task_description": "B"}'),
        False,
    ),
    ("duplicate turn key", line().replace('"action": "ls"', '"action": "ls", "action": "pwd"'), False),
    ("duplicate turn key, escaped", line().replace('"action": "ls"', '"action": "ls", "\\u0061ction": "pwd"'), False),
    ("duplicate metadata key", line(metadata={"k": 1}).replace('"k": 1', '"k": 1, "k": 2'), False),
    ("unknown turn key", line(turns=[turn(extra=1)]), False),
    ("number action", line(turns=[turn(action=7)]), False),
    ("boolean observation", line(turns=[turn(observation=True)]), False),
    ("object observation", line(turns=[turn(observation={"a": 1})]), False),
    ("array action", line(turns=[turn(action=["ls"])]), False),
    ("minified JSON text observation", line(turns=[turn(observation='{"a":1}')]), False),
    ("spaced JSON text observation", line(turns=[turn(observation='{"a": 1}')]), True),
    ("number-like text action", line(turns=[turn(action="7")]), False),
    ("number tool name", line(turns=[turn(tool_name=7)]), False),
    ("string is_error", line(turns=[turn(is_error="true")]), False),
    ("null is_error", line(turns=[turn(is_error=None)]), False),
    ("missing is_error", line(turns=[{"action": "ls", "observation": "x"}]), True),
    (
        "missing is_error and explicit null",
        line(turns=[{"action": "a", "observation": "x"}, turn(is_error=None)]),
        False,
    ),
    ("string metadata", line(metadata="x"), False),
    ("empty-list metadata", line(metadata=[]), False),
    ("turn metadata", line(turns=[turn(metadata={"kind": "format_error"})]), True),
    ("string system", line(system="x"), False),
    ("empty system", line(system={}), True),
    ("missing system", json.dumps({"turns": [turn()]}), True),
    ("tools object", line(system={"task_description": "s", "tools": {}}), False),
    ("tools string", line(system={"task_description": "s", "tools": "x"}), False),
    (
        "tools with float and escapes",
        line(system={"task_description": "s", "tools": [{"name": "t\u00e9\x01", "max": 1e5}]}),
        True,
    ),
    ("null domain", line(domain=None), False),
    ("number domain", line(domain=7), False),
    ("missing domain", json.dumps({"turns": [turn()]}), True),
    ("unknown domain", line(domain="moon"), False),
    ("number task", line(task=7), False),
    ("string reward", line(outcome_reward="0.5"), False),
    ("boolean reward", line(outcome_reward=True), False),
    ("integer reward", line(outcome_reward=3), True),
    (
        "huge integer reward",
        line().replace('"outcome_reward": null', '"outcome_reward": 123456789012345678901234567890'),
        False,
    ),
    ("empty turns", line(turns=[]), False),
    ("null turns", line(turns=None), False),
    ("null turn", line(turns=[None]), False),
    ("string turn", line(turns=["ls"]), False),
    ("observation over the cap", line(turns=[turn(observation="é" * 101)]), False),
    ("observation at the cap in characters", line(turns=[turn(observation="é" * 100)]), True),
    ("not an object", "[1, 2]", False),
    ("byte order mark", "\ufeff" + line(), False),
    ("lone surrogate escape", line().replace('"a.txt\\n"', '"\\ud800"'), False),
    ("surrogate pair escape", line().replace('"a.txt\\n"', '"\\ud83d\\ude00"'), True),
    ("NUL escape", line().replace('"a.txt\\n"', '"a\\u0000b"'), True),
    ("invalid UTF-8", line().encode().replace(b"a.txt", b"a\xff.txt"), False),
    ("not JSON", "{bad", False),
    ("spaces around colons", line().replace('": ', '" : '), True),
    ("missing schema", json.dumps({"domain": "web", "turns": [turn()]}), True),
    ("number schema", line(schema=7), False),
    ("unknown top-level key", line(id="run-7"), False),
    ("unknown system key", line(system={"task_description": "s", "rules": "none"}), False),
    ("null metadata", line(metadata=None), True),
    ("null turn metadata", line(turns=[turn(metadata=None)]), True),
    ("empty-list turn metadata", line(turns=[turn(metadata=[])]), False),
    ("null task description", line(system={"task_description": None}), True),
    ("negative zero and exponent rewards", line(outcome_reward=-0.0).replace("-0.0", "-1.5e2"), True),
    ("action over the cap", line(turns=[turn(action="a" * 51)]), False),
]


@pytest.mark.parametrize("name,edge,vouched", EDGE_LINES, ids=[e[0] for e in EDGE_LINES])
def test_edge_line_ends_as_the_python_adapter_ends_it(tmp_path, monkeypatch, name, edge, vouched):
    good = [line(task=f"good {n}") for n in range(3)]
    path = write_lines(tmp_path / "edge.jsonl", [good[0], "", edge, good[1], good[2]])
    fast, python, routed = ingest_both(tmp_path, monkeypatch, path, max_action_chars=50, max_observation_chars=100)
    assert fast == python
    assert fast["metrics"]["records_read"] == 4
    assert (routed == []) == vouched, f"routed to Python: {routed}"


def test_crlf_lines_and_a_last_line_without_newline(tmp_path, monkeypatch):
    lines = [line(task=f"t{n}") for n in range(4)]
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"\r\n".join(x.encode() for x in lines))  # no newline after the last line
    fast, python, routed = ingest_both(tmp_path, monkeypatch, path, batch_trajectories=3)
    assert fast == python and fast["metrics"]["added"] == 4
    assert routed == []


def test_duplicates_within_a_chunk_and_across_chunks_keep_the_first(tmp_path, monkeypatch):
    a, b = line(task="a"), line(task="b")
    path = write_lines(tmp_path / "dups.jsonl", [a, b, a, "{bad", b, a])
    fast, python, _ = ingest_both(tmp_path, monkeypatch, path, batch_trajectories=2)
    assert fast == python
    assert (fast["metrics"]["added"], fast["metrics"]["duplicates"], fast["metrics"]["quarantined"]) == (2, 3, 1)
    assert sorted(row[14] for row in fast["trajectories"]) == [f"{path}:1", f"{path}:2"]


def test_a_chunk_duckdb_refuses_goes_through_the_python_adapter(tmp_path, monkeypatch):
    path = write_lines(tmp_path / "refused.jsonl", [line(task=f"t{n}") for n in range(5)] + ["{bad"])

    def refuse(*args, **kwargs):
        raise duckdb.InvalidInputException("refused")

    monkeypatch.setattr(jsonl_sql, "stage", refuse)
    fast, python, routed = ingest_both(tmp_path, monkeypatch, path, batch_trajectories=4)
    assert fast == python
    assert len(routed) == 6


def _interrupt_mid_query(con, *args, **kwargs):
    raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")


def _interrupt_mid_scan(con, *args, **kwargs):
    """ctrl-C while DuckDB reads a registered Arrow object, as `stage` registers the chunk's lines: the
    KeyboardInterrupt raised in the Python that DuckDB called comes out as DuckDB's InvalidInputException."""
    import pyarrow as pa

    def batches():
        yield pa.record_batch([pa.array(["x"])], names=["line"])
        raise KeyboardInterrupt

    con.register("jsonl_lines", pa.RecordBatchReader.from_batches(pa.schema([("line", pa.string())]), batches()))
    con.sql("SELECT count(*) FROM jsonl_lines").fetchall()


@pytest.mark.parametrize("interrupt", [_interrupt_mid_query, _interrupt_mid_scan])
def test_ctrl_c_inside_duckdb_is_not_taken_for_a_refusal(tmp_path, monkeypatch, interrupt):
    # Either way ctrl-C arrives as a duckdb.Error: routing the chunk to the Python adapter would swallow
    # the interrupt and ingest the whole file (the CLI interrupt test once saw exit 0 after a full ingest).
    path = write_lines(tmp_path / "interrupted.jsonl", [line(task=f"t{n}") for n in range(5)])
    monkeypatch.setattr(jsonl_sql, "stage", interrupt)
    config = load_config(None, [{"workspace": {"path": str(tmp_path / "ws")}, "ingest": {"batch_trajectories": 4}}])
    with Store(config.workspace.database_path) as store:
        with pytest.raises(duckdb.Error) as raised:
            ingest.run(config, store, paths=[str(path)])
        assert interrupted(raised.value)
        assert store.scalar("SELECT count(*) FROM trajectories") == 0


@pytest.mark.parametrize("seed", range(20))
def test_line_chunks_split_as_iterating_the_file_does(tmp_path, seed):
    """Blank and whitespace lines are skipped but counted, CR stays in the line, the last line
    may lack its newline; skipping committed records and chunk sizes hold."""
    rng = random.Random(seed)
    pieces = []
    for _ in range(rng.randint(0, 40)):
        kind = rng.random()
        if kind < 0.2:
            pieces.append(rng.choice([b"", b" ", b"\t\r", b"  \x0b\x0c "]))
        elif kind < 0.3:
            pieces.append(b" x\r")
        else:
            pieces.append(bytes(rng.randint(33, 126) for _ in range(rng.randint(1, 50))))
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b"\n".join(pieces) + (b"\n" if rng.random() < 0.5 else b""))
    skip, size = rng.randint(0, 5), rng.randint(1, 7)
    expected = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if raw.strip():
                expected.append((number, raw))
    chunks = list(jsonl_lines.line_chunks(path, skip, size))
    assert all(0 < chunk.records <= size for chunk in chunks)
    assert [(int(c.numbers[i]), c.line(i)) for c in chunks for i in range(c.records)] == expected[skip:]


def test_turn_verifiers_are_stored_alike_and_route_no_line(tmp_path, monkeypatch):
    """The demo's terminal runs carry verifier code in turn metadata (issue 11): multi-line Python
    with quotes, which both readers store as the same JSON. The fast path routes exactly the lines
    it routes without the verifiers (observations such as `9\\n` that read as JSON), no more."""
    terminal = Path(__file__).resolve().parents[1] / "data" / "demo" / "terminal.jsonl"
    records = [json.loads(line) for line in terminal.read_text().splitlines()]
    expected = [t["metadata"]["verifier"] for r in records for t in r["turns"] if "verifier" in t.get("metadata", {})]
    for record in records:
        for turn in record["turns"]:
            turn.get("metadata", {}).pop("verifier", None)
    plain = write_lines(tmp_path / "plain.jsonl", [json.dumps(r, ensure_ascii=False) for r in records])
    fast, python, routed = ingest_both(tmp_path / "verifiers", monkeypatch, terminal)
    routed_plain = ingest_both(tmp_path / "plain", monkeypatch, plain)[2]
    assert fast == python
    assert [r.rsplit(":", 1)[1] for r in routed] == [r.rsplit(":", 1)[1] for r in routed_plain]
    verifiers = [
        json.loads(metadata)["verifier"] for *_, metadata in fast["turns"] if metadata and "verifier" in metadata
    ]
    assert sorted(verifiers) == sorted(expected) and len(verifiers) > 0
