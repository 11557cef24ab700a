"""Creating a new store (every migration applied to an empty file), with migration 12's sweeps run only where a
table holds rows (as `Store.migrate` does) and, as the baseline, run on every table as they first shipped.

    python bench/new_store.py [--stores 20]

Every test that writes a store, and every first command in a new workspace, creates one. The two variants
alternate store by store, so a drift of the machine's speed falls on both. Prints each one's mean time a store
and the ratio; then checks that a store holding a credential is still swept when migration 12 first runs on it.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pipeline.store.database as database
from pipeline.store.database import Store
from pipeline.store.migrations import MIGRATIONS, RowSweep

UNGUARDED = [
    (version, name, [s.sql if isinstance(s, RowSweep) else s for s in statements])
    for version, name, statements in MIGRATIONS
]


def create(path: Path, unguarded: bool) -> float:
    """Seconds to open a new store at `path`; `unguarded`: with migration 12 as it first shipped."""
    database.MIGRATIONS = UNGUARDED if unguarded else MIGRATIONS  # the name Store.migrate reads
    try:
        started = time.perf_counter()
        with Store(path) as store:
            store.execute("SELECT 1")  # opens it, which migrates it
        return time.perf_counter() - started
    finally:
        database.MIGRATIONS = MIGRATIONS


def swept_on_first_migration(folder: Path) -> bool:
    """A store holding a key in a turn, with migration 12 unrecorded (as a store written before it), is opened
    again: the key must be gone."""
    path = folder / "old.duckdb"
    with Store(path) as store:
        store.execute(
            "INSERT INTO turns VALUES ('t', 0, 'env', ?, NULL, false, NULL)", ["OPENAI_API_KEY=sk-" + "a1" * 20]
        )
        store.execute("DELETE FROM schema_migrations WHERE version = 12")
    with Store(path) as store:
        [(observation,)] = store.execute("SELECT observation FROM turns").fetchall()
    return observation == "OPENAI_API_KEY=[redacted-secret]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stores", type=int, default=20)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"sweeps on every table (baseline)": [], "sweeps where rows are": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        create(folder / "warm.duckdb", False)  # DuckDB's first connection in a process loads its extensions
        for n in range(args.stores):
            times["sweeps on every table (baseline)"].append(create(folder / f"a{n}.duckdb", True))
            times["sweeps where rows are"].append(create(folder / f"b{n}.duckdb", False))
        swept = swept_on_first_migration(folder)
    means = {name: sum(values) / len(values) for name, values in times.items()}
    baseline = means["sweeps on every table (baseline)"]
    for name, mean in means.items():
        print(f"{name:36s} {mean * 1000:7.1f} ms a new store   ratio {mean / baseline:.2f}")
    print(f"a store with a key in a turn, migrated to 12: {'swept' if swept else 'NOT SWEPT'}")
    if not swept:
        sys.exit(1)


if __name__ == "__main__":
    main()
