"""Ingest + filter throughput against DuckDB's own JSON reader on the same file.

    .venv/bin/python bench/ingest.py [--trajectories 100000]

Generates N synthetic trajectories (about 10 turns each) as simulacra JSONL, then, in the same run:
  floor:  DuckDB `read_json` of the file into a table of a fresh database (parse + store, nothing else)
  ours:   `simulacra ingest FILE` then `simulacra filter`, as a user runs them (fresh workspace)
Prints turns/s for both and the ratio. Absolute times vary on shared machines; the ratio is the figure.
"""

import argparse
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import orjson

REPO = Path(__file__).resolve().parents[1]
SIMULACRA = [sys.executable, "-m", "pipeline.cli"]

COMMANDS = ["ls", "cat README.md", "grep -n TODO src/app.py", "python3 -m pytest -q", "git status", "wc -l data.csv"]
WORDS = "the of file line error value config test module return import data result path user request".split()


def synthetic_trajectory(rng: random.Random, n: int) -> dict:
    turns = []
    for i in range(rng.randint(5, 15)):
        action = f"{rng.choice(COMMANDS)} {n}-{i}"
        observation = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))
        turns.append({"action": action, "observation": observation, "tool_name": "bash", "is_error": False})
    return {
        "schema": "simulacra/trajectory-v1",
        "domain": "terminal",
        "task": f"task {n}",
        "system": {"task_description": "You simulate a Linux shell.", "tools": []},
        "turns": turns,
        "outcome_reward": None,
        "metadata": {"seed": n},
    }


def generate(path: Path, trajectories: int) -> int:
    rng = random.Random(0)
    turns = 0
    with path.open("wb") as handle:
        for n in range(trajectories):
            record = synthetic_trajectory(rng, n)
            turns += len(record["turns"])
            handle.write(orjson.dumps(record) + b"\n")
    return turns


def time_floor(path: Path, work: Path) -> tuple[float, float]:
    """(read_json into a table, the close after it): closing checkpoints the table into the file,
    which `simulacra ingest`, a command that closes its store, pays within its own time."""
    con = duckdb.connect(str(work / "floor.duckdb"))
    start = time.perf_counter()
    con.execute(f"CREATE TABLE raw AS SELECT * FROM read_json('{path}', format='newline_delimited')")
    elapsed = time.perf_counter() - start
    con.close()
    return elapsed, time.perf_counter() - start - elapsed


def time_ours(path: Path, work: Path) -> tuple[float, float]:
    config = work / "bench.yaml"
    config.write_text(f"workspace:\n  path: {work / 'workspace'}\n")
    timings = []
    for command in (["ingest", str(path)], ["filter"]):
        start = time.perf_counter()
        subprocess.run([*SIMULACRA, "--config", str(config), *command], check=True, cwd=REPO)
        timings.append(time.perf_counter() - start)
    return timings[0], timings[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trajectories", type=int, default=100_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="simulacra-bench-ingest-"))
    try:
        path = work / "trajectories.jsonl"
        turns = generate(path, args.trajectories)
        size_mb = path.stat().st_size / 1e6
        print(f"generated {args.trajectories} trajectories, {turns} turns, {size_mb:.0f} MB")
        floor, floor_close = time_floor(path, work)
        ingest_s, filter_s = time_ours(path, work)
        ours = ingest_s + filter_s
        print(f"duckdb read_json (floor): {floor:7.2f} s  {turns / floor:10,.0f} turns/s")
        print(f"simulacra ingest:         {ingest_s:7.2f} s  {turns / ingest_s:10,.0f} turns/s")
        print(f"simulacra filter:         {filter_s:7.2f} s  {turns / filter_s:10,.0f} turns/s")
        print(f"ingest + filter:          {ours:7.2f} s  {turns / ours:10,.0f} turns/s")
        print(
            f"ratio ingest / floor:            {ingest_s / floor:.2f}x  "
            f"({ingest_s / (floor + floor_close):.2f}x of the floor with its close, {floor + floor_close:.2f} s)"
        )
        print(f"ratio (ingest + filter) / floor: {ours / floor:.2f}x  (target: <= 3x, and >= 50,000 turns/s)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
