"""What scanning text for credential shapes costs (pipeline/secret_shapes.py), three patterns in the same run:

- `seven shapes`: the seven shapes before 2026-12-06, each branch with its own `\\b` (the baseline);
- `all, \\b per branch`: every shape today, joined the same way;
- `all, shared \\b` (PATTERN): the shapes that start a word behind one `\\b`.

    python bench/redaction.py [--rows 1000000] [--python-rows 200000] [--repeats 3]

DuckDB's RE2 scans `--rows` turn-like observations (what ingest and migrations 12 and 13 do in SQL); Python's `re`
substitutes in `--python-rows` of them (quarantined records, every LLM prompt, answer and error). The variants
alternate within each repeat, so a drift of the machine's speed falls on all three. Prints each time and its
ratio to the baseline; then checks that the shared form redacts exactly what the per-branch form does.
"""

import argparse
import random
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import duckdb

from pipeline.secret_shapes import FIRST_SHAPES, NAMED_ALTERNATIVE, PATTERN, REDACTED, SHAPES, replacement

VARIANTS = {
    "seven shapes": "|".join(f"(?:{SHAPES[kind]})" for kind in FIRST_SHAPES),
    "all, \\b per branch": "|".join([NAMED_ALTERNATIVE, *(f"(?:{shape})" for shape in SHAPES.values())]),
    "all, shared \\b": PATTERN,
}


def observations(con: duckdb.DuckDBPyConnection, rows: int) -> None:
    """A terminal's kind of text: listings, paths, a hex digest, a word `Bearer` that starts no credential."""
    con.execute(
        "CREATE OR REPLACE TABLE t AS SELECT 'total ' || i || E'\\n-rw-r--r-- 1 user user 1258 Dec  2 api.log\\n"
        "Bearer of news ' || md5(i::varchar) || ' drwxr-xr-x logs/worker.log ' || repeat('x', (i % 200)::int) "
        f"AS observation FROM range({rows}) r(i)"
    )


def re2_seconds(con: duckdb.DuckDBPyConnection, pattern: str) -> float:
    started = time.perf_counter()
    con.execute(f"SELECT count(*) FROM t WHERE coalesce(regexp_matches(observation, '{pattern}'), false)").fetchone()
    return time.perf_counter() - started


def python_seconds(texts: list[str], pattern: str) -> float:
    compiled = re.compile(pattern)
    started = time.perf_counter()
    for text in texts:
        compiled.sub(replacement if compiled.groups else REDACTED, text)
    return time.perf_counter() - started


def same_redactions(samples: int = 20_000) -> int:
    """Strings built from credentials of every shape and text around them: where the two forms differ."""
    keys = [
        "sk-proj-Q2x9vLm4TtR8wZp1Ys6Kd3Hf",
        "ghp_0123456789abcdefABCDEF0123456789abcd",
        "xoxb-2048-4096-abcdefABCDEF",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "Bearer 9f2c4e6a8b0d1f3e5a7c9b1d3f5e7a9c",
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
        '{"SecretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}',
        "DATABASE_URL=postgres://admin:S3cr3tP4ssw0rd!@db.internal:5432/app",
        "-----BEGIN RSA PRIVATE KEY-----\nabc\n-----END RSA PRIVATE KEY-----",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\nabc",
    ]
    pieces = [*keys, "disk-0123456789abcdefghijklmnop", "x", " ", "-", "_", "=", "\n", '"', "Bearer ", "sk-", "eyJ"]
    per_branch, shared = re.compile(VARIANTS["all, \\b per branch"]), re.compile(PATTERN)
    chooser = random.Random(0)
    differing = 0
    for _ in range(samples):
        text = "".join(chooser.choice(pieces) for _ in range(chooser.randint(1, 8)))
        differing += per_branch.sub(replacement, text) != shared.sub(replacement, text)
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--python-rows", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    con = duckdb.connect()
    observations(con, args.rows)
    texts = [row[0] for row in con.execute(f"SELECT observation FROM t LIMIT {args.python_rows}").fetchall()]
    for engine, measure, data in (("RE2 (DuckDB)", re2_seconds, con), ("Python re", python_seconds, texts)):
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for _ in range(args.repeats):
            for name, pattern in VARIANTS.items():
                times[name].append(measure(data, pattern))  # type: ignore[arg-type]  # con or texts, by engine
        baseline = sum(times["seven shapes"]) / args.repeats
        rows = args.rows if engine.startswith("RE2") else len(texts)
        for name, spent in times.items():
            mean = sum(spent) / args.repeats
            print(f"{engine:13s} {name:20s} {mean:6.2f} s for {rows:,} rows   {mean / baseline:.2f}x the seven shapes")
    print(f"strings the shared and per-branch forms redact differently: {same_redactions()} of 20,000")


if __name__ == "__main__":
    main()
