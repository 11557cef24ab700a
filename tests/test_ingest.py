"""Ingestion: quarantine with reasons, idempotency, the nightly refresh, count conservation, resume.

The project's own JSONL is read by the SQL fast path unless `ingest.sql_fast_path` is off; tests
that matter for both readers run once per reader (`reader` fixture). That the two store the same
rows is tests/test_ingest_fast_path.py."""

import json
import os
from pathlib import Path

import pytest

from pipeline.errors import UserFixableError
from pipeline.formats.simulacra_jsonl import to_record
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import ingest


def trajectory(n: int, turns: int = 3, domain: str = "terminal") -> Trajectory:
    return Trajectory(
        source="",
        domain=domain,
        system=SystemPrompt(task_description="A Linux shell in a project folder."),
        turns=[Turn(action=f"cat notes{n}_{i}.txt", observation=f"line {n} {i}\n") for i in range(turns)],
    )


def write_jsonl(path: Path, lines: list[str | bytes]) -> Path:
    with path.open("wb") as handle:
        for line in lines:
            handle.write(line if isinstance(line, bytes) else line.encode())
            handle.write(b"\n")
    return path


@pytest.fixture(params=["sql", "python"])
def reader(request, config):
    """Run the test with the SQL fast path, then with the Python adapter alone."""
    config.ingest.sql_fast_path = request.param == "sql"
    return request.param


def good(n: int, **kwargs) -> str:
    return json.dumps(to_record(trajectory(n, **kwargs)))


def counts_conserved(metrics: dict) -> bool:
    return metrics["records_read"] == metrics["added"] + metrics["duplicates"] + metrics["quarantined"]


MALFORMED = [
    # (record line, expected reason fragment)
    ("{not json", "invalid JSON"),
    (b'{"schema": "simulacra/trajectory-v1", "turns": [{"action": "ls", "observation": "\xff\xfe"}]}', "invalid UTF-8"),
    ('{"schema": "simulacra/trajectory-v1", "turns": [{"action": "ls", "observation": "\\ud800"}]}', "invalid UTF-8"),
    (
        '{"schema": "simulacra/trajectory-v1", "turns": [{"action": 7, "observation": "x"}]}',
        "turns[0].action: expected a string, got int",
    ),
    ('{"schema": "simulacra/trajectory-v1", "turns": []}', "no turns"),
    ('{"schema": "simulacra/trajectory-v1", "turns": "ls"}', "`turns`: expected a list"),
    (
        '{"schema": "simulacra/trajectory-v1", "domain": "moon", "turns": [{"action": "a", "observation": "b"}]}',
        "domain 'moon'",
    ),
    (
        '{"schema": "simulacra/trajectory-v1", "turns": [{"action": "a", "observation": "' + "x" * 120 + '"}]}',
        "exceeds the cap of 100",
    ),
    (
        '{"schema": "simulacra/trajectory-v1", "outcome_reward": "high", "turns": [{"action": "a", "observation": "b"}]}',
        "`outcome_reward`: expected a number",
    ),
]


@pytest.mark.parametrize("line,reason", MALFORMED, ids=[r for _, r in MALFORMED])
def test_malformed_record_is_quarantined_with_reason_and_location(config, store, tmp_path, reader, line, reason):
    config.ingest.max_observation_chars = 100
    # Blank lines count for the location and are not records.
    path = write_jsonl(tmp_path / "mixed.jsonl", [good(1), "", "  ", line, good(2)])
    result = ingest.run(config, store, paths=[str(path)])
    assert result.metrics["added"] == 2
    assert result.metrics["quarantined"] == 1
    row = store.rows("SELECT location, error, raw FROM quarantine")[0]
    assert reason in row["error"]
    assert row["location"] == f"{path}:4"
    assert row["raw"]
    assert counts_conserved(result.metrics)


def test_reingesting_adds_nothing_and_skips_unchanged_files(config, store, tmp_path, reader):
    path = write_jsonl(tmp_path / "a.jsonl", [good(i) for i in range(5)] + ["{bad"])
    first = ingest.run(config, store, paths=[str(path)])
    second = ingest.run(config, store, paths=[str(path)])
    assert (first.metrics["added"], first.metrics["quarantined"]) == (5, 1)
    assert second.metrics["files_unchanged"] == 1 and second.metrics["records_read"] == 0
    assert second.summary.endswith("; 5 trajectories in the store")  # what a skip of this run shows later
    rescan = ingest.run(config, store, paths=[str(path)], rescan=True)
    assert (rescan.metrics["added"], rescan.metrics["duplicates"], rescan.metrics["quarantined"]) == (0, 5, 1)
    assert store.scalar("SELECT count(*) FROM trajectories") == 5
    assert store.scalar("SELECT count(*) FROM turns") == 15
    assert store.scalar("SELECT count(*) FROM quarantine") == 1


def test_nightly_refresh_adds_only_new_files_and_new_trajectories(config, store, tmp_path):
    folder = tmp_path / "drop"
    folder.mkdir()
    write_jsonl(folder / "monday.jsonl", [good(i) for i in range(4)])
    ingest.run(config, store, paths=[str(folder)])
    # Tuesday's export repeats two of Monday's trajectories and brings three new ones.
    write_jsonl(folder / "tuesday.jsonl", [good(i) for i in range(2, 7)])
    result = ingest.run(config, store, paths=[str(folder)])
    assert result.metrics["files_unchanged"] == 1
    assert (result.metrics["added"], result.metrics["duplicates"]) == (3, 2)
    assert store.scalar("SELECT count(*) FROM trajectories") == 7


def test_same_trajectory_in_one_batch_or_two_sources_is_one_row(config, store, tmp_path, reader):
    a = write_jsonl(tmp_path / "a.jsonl", [good(1), good(1)])
    b = write_jsonl(tmp_path / "b.jsonl", [good(1)])
    first = ingest.run(config, store, paths=[str(a)])
    second = ingest.run(config, store, paths=[str(b)], source_name="mirror")
    assert (first.metrics["added"], first.metrics["duplicates"]) == (1, 1)
    assert (second.metrics["added"], second.metrics["duplicates"]) == (0, 1)
    assert store.scalar("SELECT count(*) FROM trajectories") == 1


def test_killed_run_resumes_after_last_committed_batch(config, store, tmp_path, monkeypatch, reader):
    config.ingest.batch_trajectories = 3
    path = write_jsonl(tmp_path / "big.jsonl", [good(i) for i in range(10)] + ["{bad"])
    real_commit = ingest._commit
    calls = {"n": 0}

    def dying_commit(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("killed")  # the process dies before the third batch commits
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(ingest, "_commit", dying_commit)
    with pytest.raises(KeyboardInterrupt):
        ingest.run(config, store, paths=[str(path)])
    assert store.scalar("SELECT count(*) FROM trajectories") == 6
    assert store.scalar("SELECT completed FROM ingested_files") is False

    # What the second run reads: records through the Python adapter, lines through DuckDB.
    parsed, staged = [], []
    real_parse, real_stage = ingest._parse, ingest.jsonl_sql.stage
    monkeypatch.setattr(ingest, "_commit", real_commit)
    monkeypatch.setattr(ingest, "_parse", lambda record, *a: parsed.append(record.location) or real_parse(record, *a))
    monkeypatch.setattr(
        ingest.jsonl_sql,
        "stage",
        lambda con, chunk, *a: staged.extend(chunk.numbers.tolist()) or real_stage(con, chunk, *a),
    )
    result = ingest.run(config, store, paths=[str(path)])
    # Records committed before the kill are not read again.
    if reader == "sql":
        assert staged == [7, 8, 9, 10, 11]
        assert parsed == [f"{path}:11"], "only the bad line goes to the Python adapter"
    else:
        assert len(parsed) == 5 and not staged
    assert store.scalar("SELECT count(*) FROM trajectories") == 10
    assert store.scalar("SELECT count(*) FROM turns") == 30
    row = store.rows("SELECT records_read, added, duplicates, quarantined, completed FROM ingested_files")[0]
    assert row == {"records_read": 11, "added": 10, "duplicates": 0, "quarantined": 1, "completed": True}
    assert counts_conserved(result.metrics)


def test_unknown_format_fails_before_any_work(config, store, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [good(1)])
    with pytest.raises(ValueError, match="unknown format 'nope'"):
        ingest.run(config, store, paths=[str(path)], format_name="nope")
    assert store.scalar("SELECT count(*) FROM ingested_files") == 0


def test_missing_path_is_a_clear_error(config, store, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file, folder or glob"):
        ingest.run(config, store, paths=[str(tmp_path / "absent.jsonl")])


def _hard_link(data: Path) -> None:
    (data / "b.jsonl").hardlink_to(data / "a.jsonl")


def _two_links_to_one_folder(data: Path) -> None:
    elsewhere = data.parent / "elsewhere"
    elsewhere.mkdir()
    write_jsonl(elsewhere / "c.jsonl", [good(100)])
    (data / "x").symlink_to(elsewhere)
    (data / "y").symlink_to(elsewhere)


def _link_up_from_a_subfolder(data: Path) -> None:
    (data / "sub").mkdir()
    (data / "sub" / "up").symlink_to("..")


# (what lies beside data/a.jsonl, records read, paths skipped and why). a.jsonl holds 9 trajectories and
# 2 malformed records; whatever else names it, it is read once (issue 29.1: `data/self -> .` read it 41 times).
LINKED = [
    (
        "a link to its own folder",
        lambda data: (data / "self").symlink_to("."),
        11,
        [("self", "a link back to {data}, which holds it: a loop, not followed")],
    ),
    (
        "a link up from a subfolder",
        _link_up_from_a_subfolder,
        11,
        [("sub/up", "a link back to {data}, which holds it: a loop, not followed")],
    ),
    (
        "a second name of the file",
        lambda data: (data / "b.jsonl").symlink_to("a.jsonl"),
        11,
        [("b.jsonl", "the same file as {data}/a.jsonl: read once")],
    ),
    ("a hard link to the file", _hard_link, 11, [("b.jsonl", "the same file as {data}/a.jsonl: read once")]),
    (
        "two links to one folder elsewhere",
        _two_links_to_one_folder,
        12,
        [("y", "the same folder as {data}/x: read once")],
    ),
    (
        "a link that loops",
        lambda data: (data / "loop.jsonl").symlink_to("loop.jsonl"),
        11,
        [("loop.jsonl", "a symbolic link loop: not read")],
    ),
]


@pytest.mark.parametrize("lay_out,records,skipped", [case[1:] for case in LINKED], ids=[case[0] for case in LINKED])
def test_a_folder_walk_reads_each_real_file_once_and_names_each_link_it_skips(
    config, store, tmp_path, lay_out, records, skipped
):
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "a.jsonl", [good(i) for i in range(9)] + ["{bad", "{worse"])
    lay_out(data)
    result = ingest.run(config, store, paths=[str(data)])
    assert result.metrics["records_read"] == records and result.metrics["quarantined"] == 2
    assert (result.metrics["added"], result.metrics["duplicates"]) == (records - 2, 0)
    assert result.metrics["paths_skipped"] == [
        {"path": str(data / path), "reason": reason.format(data=data)} for path, reason in skipped
    ]
    assert f"1 path(s) skipped: {data / skipped[0][0]} (" in result.summary
    assert result.metrics["paths_not_read"] == []


def test_a_folder_walk_passes_over_hidden_folders_but_reads_a_hidden_folder_it_is_given(config, store, tmp_path):
    """JupyterLab keeps a stale copy of an edited file in `.ipynb_checkpoints/` and a repository's `.git/` may hold
    JSON: the walk read them as trajectories of their own (a checkpoint edited apart from its file was a second
    trajectory), and quarantined the rest. Hidden names were already passed over; hidden folders now are too."""
    data = tmp_path / "data"
    (data / ".ipynb_checkpoints").mkdir(parents=True)
    (data / ".git").mkdir()
    write_jsonl(data / "runs.jsonl", [good(i) for i in range(3)])
    write_jsonl(data / ".ipynb_checkpoints" / "runs-checkpoint.jsonl", [good(i) for i in range(3, 5)])
    (data / ".git" / "config.json").write_text('{"core": {}}')
    result = ingest.run(config, store, paths=[str(data)])
    assert (result.metrics["records_read"], result.metrics["added"], result.metrics["quarantined"]) == (3, 3, 0)
    given = ingest.run(config, store, paths=[str(data / ".ipynb_checkpoints")])
    assert (given.metrics["records_read"], given.metrics["added"]) == (2, 2)


# (what the path given is, what ingestion says of it)
NOT_FILES = [
    ("a named pipe", os.mkfifo, "a named pipe (FIFO), not a file: not read"),
    (
        "a symbolic link loop",
        lambda path: path.symlink_to(path.name),
        "a symbolic link loop (it never reaches a file): not read",
    ),
]


@pytest.mark.parametrize("make,said", [case[1:] for case in NOT_FILES], ids=[case[0] for case in NOT_FILES])
def test_a_path_that_is_no_file_is_named_for_what_it_is_and_not_read(config, store, tmp_path, make, said):
    """Issue 29.6: both were "no such file, folder or glob match"; a pipe is never opened (that waits for a writer)."""
    path = tmp_path / "given.jsonl"
    make(path)
    with pytest.raises(UserFixableError) as refused:
        ingest.run(config, store, paths=[str(path)])
    assert str(refused.value) == f"{path}: {said}"
    assert store.scalar("SELECT count(*) FROM ingested_files") == 0


def test_unrecognised_file_is_quarantined_not_fatal(config, store, tmp_path):
    (tmp_path / "notes.json").write_text('{"hello": "world"}')
    result = ingest.run(config, store, paths=[str(tmp_path / "notes.json")])
    assert result.metrics["quarantined"] == 1
    assert "no format adapter recognises" in store.scalar("SELECT error FROM quarantine")


def test_public_trajectories_ingest_with_conserved_counts(config, store, public_data):
    """Every public file parses or is quarantined for a stated reason; a second run adds nothing."""
    result = ingest.run(config, store, paths=[str(public_data)])
    m = result.metrics
    assert counts_conserved(m)
    assert (m["records_read"], m["added"], m["duplicates"], m["quarantined"]) == (171, 149, 6, 16)
    by_format = dict(store.execute("SELECT format, count(*) FROM trajectories GROUP BY format").fetchall())
    assert by_format == {"openai-chat": 91, "swe-agent": 20, "text-game": 36, "mini-swe-agent": 1, "openhands": 1}
    reasons = {row[0] for row in store.execute("SELECT error FROM quarantine").fetchall()}
    assert all(reason.startswith("no environment actions") for reason in reasons)
    again = ingest.run(config, store, paths=[str(public_data)])
    assert again.metrics["records_read"] == 0 and again.metrics["files_unchanged"] == m["files_read"]


def test_a_file_read_in_a_wrong_format_is_read_again_when_another_is_asked(config, store):
    """A wrong `--format` sends every record to quarantine and marks the file read; asking the right format must
    not answer "unchanged, skipped". The file is read again, and the first read's quarantined records are taken
    back, so the store's counts are the file's once."""
    path = Path(__file__).resolve().parents[1] / "data" / "demo" / "tool_calls.json"
    wrong = ingest.run(config, store, paths=[str(path)], format_name="openhands")
    assert wrong.metrics["added"] == 0 and wrong.metrics["quarantined"] == wrong.metrics["records_read"] > 0
    right = ingest.run(config, store, paths=[str(path)], format_name="openai-chat")
    assert right.metrics["files_unchanged"] == 0 and right.metrics["added"] > 0
    assert counts_conserved(right.metrics)
    quarantined = store.scalar("SELECT count(*) FROM quarantine")
    assert quarantined == right.metrics["quarantined"]
    (row,) = store.rows("SELECT format, records_read, added, quarantined FROM ingested_files")
    assert (row["format"], row["added"], row["quarantined"]) == ("openai-chat", right.metrics["added"], quarantined)
    # Asked in the same format again, or with none, it is read already.
    assert ingest.run(config, store, paths=[str(path)], format_name="openai-chat").metrics["files_unchanged"] == 1
    assert ingest.run(config, store, paths=[str(path)]).metrics["files_unchanged"] == 1
