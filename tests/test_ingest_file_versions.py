"""The nightly refresh when files change, leave their folder or come back: a file's content is its version, the
trajectories only a replaced version held are retired (kept in the store, in no pool), and what was wrong with an old
version leaves quarantine. Found by probing: an edited eval trajectory stayed in eval while its corrected copy
trained in cpt, a deleted file's runs stayed in every pool, a fixed record stayed in quarantine."""

import json
from pathlib import Path

import pytest

from pipeline.formats.simulacra_jsonl import to_record
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import filter as filter_stage
from stages import ingest, stats
from stages import split as split_stage


def run_line(n: int, last: str = "done") -> str:
    """One terminal run of task `n`; `last` is its last observation (what an edit changes)."""
    turns = [Turn(action=f"cat notes{n}_{i}.txt", observation=f"line {n} {i}\n") for i in range(3)]
    turns.append(Turn(action="echo finished", observation=last))
    trajectory = Trajectory(
        source="",
        domain="terminal",
        task=f"task {n}",
        system=SystemPrompt(task_description="A Linux shell in a project folder."),
        turns=turns,
    )
    return json.dumps(to_record(trajectory))


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture(params=["sql", "python"])
def reader(request, config):
    config.ingest.sql_fast_path = request.param == "sql"
    return request.param


def kept_tasks(store) -> list[str]:
    return [row[0] for row in store.execute("SELECT task FROM kept_trajectories ORDER BY task").fetchall()]


def pooled(store) -> dict[str, str]:
    """Each pooled trajectory's last observation, by task."""
    rows = store.execute(
        "SELECT t.task, u.observation FROM splits s JOIN trajectories t USING (trajectory_id) "
        "JOIN turns u USING (trajectory_id) WHERE u.turn_index = 3"
    ).fetchall()
    assert len({task for task, _ in rows}) == len(rows), f"a task pooled twice: {rows}"
    return dict(rows)


def refresh(config, store, folder: Path):
    result = ingest.run(config, store, paths=[str(folder)], source_name="runs")
    filter_stage.run(config, store)
    split_stage.run(config, store)
    return result


def test_an_edited_file_replaces_its_old_version_in_every_pool(config, store, tmp_path, reader):
    folder = tmp_path / "runs"
    folder.mkdir()
    write(folder / "a.jsonl", [run_line(n) for n in range(6)])
    refresh(config, store, folder)
    assert pooled(store) == {f"task {n}": "done" for n in range(6)}

    # Tonight's export corrects run 2's last observation and appends run 6.
    write(folder / "a.jsonl", [run_line(n, "done (fixed)" if n == 2 else "done") for n in range(7)])
    result = refresh(config, store, folder)

    assert (result.metrics["added"], result.metrics["duplicates"]) == (2, 5)
    assert result.metrics["retired_by_this_run"] == 1 and result.metrics["trajectories_retired"] == 1
    assert "+1 trajectories retired, 1 in all" in result.summary
    assert pooled(store) == {**{f"task {n}": "done" for n in range(7)}, "task 2": "done (fixed)"}
    assert store.scalar("SELECT count(*) FROM trajectories") == 8, "the old version is kept, not deleted"
    assert kept_tasks(store) == [f"task {n}" for n in range(7)]
    row = stats.sources_report(store)[0]
    assert (row["files"], row["records_read"], row["added"], row["duplicates"], row["retired"]) == (1, 7, 2, 5, 1)


def test_a_file_gone_from_its_folder_takes_only_what_no_other_file_holds(config, store, tmp_path, reader):
    folder = tmp_path / "runs"
    folder.mkdir()
    write(folder / "monday.jsonl", [run_line(n) for n in range(4)])
    write(folder / "tuesday.jsonl", [run_line(n) for n in range(3, 6)])  # run 3 in both
    refresh(config, store, folder)
    (folder / "monday.jsonl").unlink()

    result = refresh(config, store, folder)
    assert result.metrics["files_gone"] == [str(folder / "monday.jsonl")]
    assert "1 file(s) read before are no longer in their folder" in result.summary
    assert sorted(pooled(store)) == ["task 3", "task 4", "task 5"]
    assert result.metrics["trajectories_retired"] == 3

    # Renamed: the same runs under another name are the same trajectories, counted once.
    (folder / "tuesday.jsonl").rename(folder / "wednesday.jsonl")
    result = refresh(config, store, folder)
    assert result.metrics["files_gone"] == [str(folder / "tuesday.jsonl")]
    assert result.metrics["duplicates"] == 3 and result.metrics["retired_by_this_run"] == 0
    assert sorted(pooled(store)) == ["task 3", "task 4", "task 5"]
    row = stats.sources_report(store)[0]
    assert (row["files"], row["records_read"], row["trajectories"], row["retired"]) == (1, 3, 6, 3)

    # A file put back as it was is read again and its runs come back.
    write(folder / "monday.jsonl", [run_line(n) for n in range(4)])
    result = refresh(config, store, folder)
    assert result.metrics["files_read"] == 1 and result.metrics["retired_by_this_run"] == -3
    assert sorted(pooled(store)) == [f"task {n}" for n in range(6)]


def test_a_record_fixed_in_a_later_version_leaves_quarantine_and_comes_back_with_the_old(
    config, store, tmp_path, reader
):
    folder = tmp_path / "runs"
    folder.mkdir()
    broken = run_line(1)[:40]  # the line cut short
    write(folder / "live.jsonl", [run_line(0), broken])
    refresh(config, store, folder)
    assert store.scalar("SELECT count(*) FROM quarantine") == 1

    write(folder / "live.jsonl", [run_line(0), run_line(1)])
    refresh(config, store, folder)
    assert store.scalar("SELECT count(*) FROM quarantine") == 0
    row = stats.sources_report(store)[0]
    assert (row["records_read"], row["added"], row["duplicates"], row["quarantined"]) == (2, 1, 1, 0)
    assert sorted(pooled(store)) == ["task 0", "task 1"]

    # The old version put back: its bad line is quarantined again, and run 1 is held by no current version.
    write(folder / "live.jsonl", [run_line(0), broken])
    refresh(config, store, folder)
    assert store.scalar("SELECT count(*) FROM quarantine") == 1
    assert sorted(pooled(store)) == ["task 0"]
    row = stats.sources_report(store)[0]
    assert (row["records_read"], row["quarantined"], row["retired"]) == (2, 1, 1)


def test_a_new_version_killed_part_way_leaves_the_old_one_in_the_pools_until_it_completes(
    config, store, tmp_path, monkeypatch, reader
):
    config.ingest.batch_trajectories = 2
    folder = tmp_path / "runs"
    folder.mkdir()
    write(folder / "a.jsonl", [run_line(n) for n in range(6)])
    refresh(config, store, folder)
    write(folder / "a.jsonl", [run_line(n, "edited") for n in range(6)])

    real_commit, calls = ingest._commit, {"n": 0}

    def dying_commit(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real_commit(*args, **kwargs)

    monkeypatch.setattr(ingest, "_commit", dying_commit)
    with pytest.raises(KeyboardInterrupt):
        ingest.run(config, store, paths=[str(folder)], source_name="runs")
    assert store.scalar("SELECT count(*) FROM retired_trajectories") == 0
    assert len(kept_tasks(store)) == 6

    monkeypatch.setattr(ingest, "_commit", real_commit)
    refresh(config, store, folder)
    assert pooled(store) == {f"task {n}": "edited" for n in range(6)}
    assert store.scalar("SELECT count(*) FROM retired_trajectories") == 6


def test_files_read_before_versions_were_recorded_are_read_once_more_and_then_retire(config, store, tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    write(folder / "a.jsonl", [run_line(n) for n in range(3)])
    refresh(config, store, folder)
    write(folder / "a.jsonl", [run_line(n, "edited" if n == 0 else "done") for n in range(3)])
    ingest.run(config, store, paths=[str(folder)], source_name="runs")
    # As a store ingested before migration 15 holds them: both versions, neither's trajectories recorded.
    store.execute("DELETE FROM file_trajectories")
    store.execute("UPDATE ingested_files SET trajectories_recorded = false")
    assert store.scalar("SELECT count(*) FROM retired_trajectories") == 0, "an unrecorded file may hold any of them"

    result = refresh(config, store, folder)
    assert result.metrics["files_read"] == 1 and result.metrics["duplicates"] == 3
    assert store.scalar("SELECT count(*) FROM retired_trajectories") == 1
    assert pooled(store)["task 0"] == "edited"
    assert ingest.run(config, store, paths=[str(folder)], source_name="runs").metrics["files_unchanged"] == 1


def test_a_walk_that_could_not_read_a_file_does_not_take_it_for_gone(config, store, tmp_path, monkeypatch):
    folder = tmp_path / "runs"
    folder.mkdir()
    write(folder / "a.jsonl", [run_line(0)])
    write(folder / "b.jsonl", [run_line(1)])
    refresh(config, store, folder)
    unreadable = str(folder / "b.jsonl")
    real_expand = ingest.expand_source

    def walk_that_cannot_list_b(spec, name, not_read, skipped):
        inputs = real_expand(spec, name, not_read, skipped)
        not_read.append(ingest.NotRead(unreadable, "Permission denied"))
        return [item for item in inputs if item.path != unreadable]

    monkeypatch.setattr(ingest, "expand_source", walk_that_cannot_list_b)
    result = refresh(config, store, folder)
    assert result.metrics["files_gone"] == [] and sorted(pooled(store)) == ["task 0", "task 1"]
