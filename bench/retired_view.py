"""What the retired trajectories cost the views every later stage reads, in one run.

    .venv/bin/python bench/retired_view.py [--trajectories 200000] [--turns 8] [--files 2000] [--repeats 5]

Migration 15 takes the trajectories no current version of a file holds (`retired_trajectories`) out of
`kept_trajectories` and `kept_turns`, which split, score, the fingerprints and the fidelity stage read. This builds
a store of N trajectories of T turns in F files (each file's version recorded in `file_trajectories`, every tenth
file replaced by a newer version that drops a tenth of its runs, so some trajectories are retired), then times, on
that store, the views as they are and as they were before 15 (the same joins without the retired filter): a count
of `kept_turns`, and split's grouping of `kept_trajectories`. Prints each query's seconds (best of `--repeats`),
the ratio and the rows each returned.
"""

import argparse
import tempfile
import time
from pathlib import Path

from pipeline.store.database import Store

BEFORE_15 = {
    "kept_trajectories": """SELECT t.* FROM trajectories t JOIN filter_state f USING (trajectory_id) WHERE f.kept""",
    "kept_turns": """SELECT u.* FROM turns u JOIN filter_state f USING (trajectory_id)
        WHERE f.kept AND NOT EXISTS (SELECT 1 FROM filter_decisions d
            WHERE d.trajectory_id = u.trajectory_id AND d.turn_index = u.turn_index)""",
}
QUERIES = {
    "count of kept_turns": "SELECT count(*) FROM {kept_turns}",
    "split's groups of kept_trajectories": "SELECT count(DISTINCT coalesce(task, trajectory_id)) FROM {kept_trajectories}",
}


def build(store: Store, trajectories: int, turns: int, files: int) -> None:
    con = store.connection
    con.execute(
        f"""INSERT INTO trajectories (trajectory_id, source, format, domain, task, task_description, num_turns,
            location, ingested_at)
        SELECT 't' || i, 'bench', 'simulacra-jsonl', 'terminal', 'task ' || (i % 5000), 'simulate', {turns},
            'f' || (i % {files}) || '.jsonl:' || i, now() FROM range({trajectories}) r(i)"""
    )
    con.execute(
        f"""INSERT INTO turns SELECT 't' || i, j, 'ls ' || j, 'out ' || j, NULL, false, NULL
        FROM range({trajectories}) r(i), range({turns}) s(j)"""
    )
    con.execute(f"INSERT INTO filter_state SELECT 't' || i, 'filter-v1', true, {turns} FROM range({trajectories}) r(i)")
    # Every file's first version; every tenth file has a second, current one holding nine tenths of its runs.
    con.execute(
        f"""INSERT INTO ingested_files (path, sha256, source, format, size_bytes, records_read, added, duplicates,
            quarantined, completed, updated_at, superseded_at, trajectories_recorded)
        SELECT 'f' || k || '.jsonl', 'v1', 'bench', 'simulacra-jsonl', 0, 0, 0, 0, 0, true, now(),
            CASE WHEN k % 10 = 0 THEN now() END, true FROM range({files}) r(k)
        UNION ALL
        SELECT 'f' || k || '.jsonl', 'v2', 'bench', 'simulacra-jsonl', 0, 0, 0, 0, 0, true, now(), NULL, true
        FROM range(0, {files}, 10) r(k)"""
    )
    con.execute(
        f"""INSERT INTO file_trajectories SELECT 'f' || (i % {files}) || '.jsonl', 'v1', 'bench', 't' || i
        FROM range({trajectories}) r(i)
        UNION ALL
        SELECT 'f' || (i % {files}) || '.jsonl', 'v2', 'bench', 't' || i FROM range({trajectories}) r(i)
        WHERE (i % {files}) % 10 = 0 AND i % 10 <> 0"""
    )
    for name, sql in BEFORE_15.items():
        con.execute(f"CREATE TEMP VIEW before_15_{name} AS {sql}")


def best(store: Store, sql: str, repeats: int) -> tuple[float, int]:
    times, value = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        value = store.scalar(sql)
        times.append(time.perf_counter() - started)
    return min(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=200_000)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "bench.duckdb") as store:
        started = time.perf_counter()
        build(store, args.trajectories, args.turns, args.files)
        retired = store.scalar("SELECT count(*) FROM retired_trajectories")
        print(
            f"store: {args.trajectories:,} trajectories x {args.turns} turns in {args.files:,} files, "
            f"{retired:,} retired; built in {time.perf_counter() - started:.1f} s"
        )
        for label, template in QUERIES.items():
            now, rows_now = best(
                store, template.format(kept_turns="kept_turns", kept_trajectories="kept_trajectories"), args.repeats
            )
            then, rows_then = best(
                store,
                template.format(kept_turns="before_15_kept_turns", kept_trajectories="before_15_kept_trajectories"),
                args.repeats,
            )
            print(
                f"{label}: with the retired filter {now:.3f} s ({rows_now:,}), before migration 15 {then:.3f} s "
                f"({rows_then:,}); ratio {now / then:.2f}x"
            )


if __name__ == "__main__":
    main()
