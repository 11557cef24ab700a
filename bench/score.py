"""Bulk scoring against the per-turn Python reference, on the same synthetic turns, in one run.

    .venv/bin/python bench/score.py [--turns 1000000] [--python-turns N]

Generates N turns (default 1M) in a fresh store: tool calls answered with JSON records or booking
confirmations, shell commands with file listings, file contents, silent successes and echoes, text
game steps, code edits acknowledged with a short rewrite. Every 20 turns share a template and
differ in ids and numbers. Then, on the same kept turns:
  bulk:      `stages.score.run` (polars over chunks of turns streamed from DuckDB, all threads)
  per-turn:  read the turns, `score_turn` on each in a Python loop, write the scores back (Arrow)
Prints turns/s of both, their ratio, CPU seconds, and the load average before and after, and checks
that both gave every turn the same category. The bulk path runs on every core and the per-turn
path on one: with the cores free the wall ratio exceeds the CPU ratio, and other processes on the
machine take it back (the CPU ratio is what a busy machine distorts least). `--python-turns`
times the per-turn path on the first N turns only and extrapolates (the output says so).
"""

import argparse
import os
import random
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.config import load_config
from pipeline.informativeness import SCORE_COLUMNS, score_turn
from pipeline.store.database import Store
from stages import score as score_stage

VARIANTS = 20  # turns generated per template; `#` in a template becomes the variant's number
SYLLABLES = "ka lo mi ne ru sa to vi ze po an el is or um".split()
OBJECTS = "cabinet drawer countertop sinkbasin toilet shelf fridge microwave desk bed".split()
ITEMS = "spraybottle soapbar cloth candle towel apple mug pen keychain book".split()


def word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4)))


def length(rng: random.Random, median: int) -> int:
    """Heavy-tailed sizes: most outputs are short, some are pages long."""
    return max(1, int(rng.lognormvariate(0, 1) * median))


def tool_call(rng: random.Random) -> tuple[str, str]:
    name = f"get_{word(rng)}_details"
    key = f"{word(rng)}_id"
    action = f'{name}({{"{key}": "{word(rng)}_#"}})'
    if rng.random() < 0.2:  # a confirmation that repeats the call's fields
        fields = {word(rng): f"{word(rng)}_#" for _ in range(rng.randint(3, 12))}
        action = f"book_{word(rng)}({fields})"
        return action, str({**fields, "status": "confirmed", "id": "#"})
    record = {
        word(rng): rng.choice([word(rng), rng.randint(0, 9999), f"{rng.random():.2f}"]) for _ in range(length(rng, 25))
    }
    return action, str(record)


def shell(rng: random.Random) -> tuple[str, str]:
    path = "/".join(word(rng) for _ in range(rng.randint(1, 3))) + ".py"
    kind = rng.random()
    if kind < 0.3:
        lines = [f"    {word(rng)} = {word(rng)}({word(rng)}, #)" for _ in range(length(rng, 20))]
        return f"cat {path}", "\n".join(lines)
    if kind < 0.5:
        return f"ls -la {path.rsplit('/', 1)[0]}", "\n".join(
            f"-rw-r--r-- 1 root {rng.randint(10, 99999)} {word(rng)}.py" for _ in range(length(rng, 8))
        )
    if kind < 0.7:
        return f"mkdir -p {path}_#", ""
    if kind < 0.85:
        text = " ".join(word(rng) for _ in range(rng.randint(1, 8)))
        return f"echo {text} #", f"{text} #"
    return (
        f"python {path}",
        f'Traceback (most recent call last):\n  File "{path}", line #\n{word(rng).title()}Error: {word(rng)}',
    )


def text_game(rng: random.Random) -> tuple[str, str]:
    place, item = f"{rng.choice(OBJECTS)} #", f"{rng.choice(ITEMS)} {rng.randint(1, 3)}"
    kind = rng.random()
    if kind < 0.4:
        seen = ", ".join(f"a {rng.choice(ITEMS)} {rng.randint(1, 3)}" for _ in range(rng.randint(0, 4)))
        return f"go to {place}", f"On the {place}, you see {seen or 'nothing'}."
    if kind < 0.7:
        return f"take {item} from {place}", f"You pick up the {item} from the {place}."
    if kind < 0.85:
        return f"put {item} in/on {place}", f"You put the {item} in/on the {place}."
    return f"examine {place}", "Nothing happens."


def code_edit(rng: random.Random) -> tuple[str, str]:
    body = "\n".join(f"{word(rng)} = {word(rng)}(#)" for _ in range(rng.randint(5, 40)))
    path = f"{word(rng)}/{word(rng)}.py"
    return f"str_replace_editor create {path} --file_text '{body}'", f"File created successfully at: {path}"


def web(rng: random.Random) -> tuple[str, str]:
    tree = "\n".join(
        f"[{rng.randint(1, 999)}] {rng.choice(['link', 'button', 'StaticText'])} '{word(rng)} {word(rng)}'"
        for _ in range(length(rng, 30))
    )
    return f"click [#{rng.randint(1, 99)}]", f"RootWebArea '{word(rng)}'\n{tree}"


DOMAINS = [
    (tool_call, "mcp", 0.3),
    (shell, "terminal", 0.3),
    (text_game, "text-game", 0.2),
    (code_edit, "swe", 0.1),
    (web, "web", 0.1),
]


def templates(count: int) -> pa.Table:
    rng = random.Random(0)
    makers = [m for m, _, _ in DOMAINS]
    weights = [w for _, _, w in DOMAINS]
    domain_of = {m: d for m, d, _ in DOMAINS}
    rows = {"template": [], "domain": [], "action": [], "observation": []}
    for n in range(count):
        maker = rng.choices(makers, weights)[0]
        action, observation = maker(rng)
        rows["template"].append(n)
        rows["domain"].append(domain_of[maker])
        rows["action"].append(action)
        rows["observation"].append(observation)
    return pa.table(rows)


def fill(store: Store, turns: int) -> None:
    """Trajectories of 10 turns from the templates, each template's 20 variants in 20 trajectories."""
    base = templates(max(1, turns // VARIANTS))
    with store.transaction() as con:
        con.register("base", base)
        con.execute(
            f"""CREATE TEMP TABLE generated AS
                SELECT 't' || (template // 10) || '-' || v AS trajectory_id,
                       (template % 10)::INTEGER AS turn_index, domain,
                       replace(action, '#', v::VARCHAR) AS action,
                       replace(observation, '#', v::VARCHAR) AS observation
                FROM base, range({VARIANTS}) AS r(v)"""
        )
        con.execute(
            """INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, num_turns,
                                        location, ingested_at)
               SELECT trajectory_id, 'bench', 'synthetic', any_value(domain), 'simulate', count(*), 'bench', now()
               FROM generated GROUP BY trajectory_id"""
        )
        con.execute(
            "INSERT INTO turns SELECT trajectory_id, turn_index, action, observation, NULL, false, NULL FROM generated"
        )
        con.execute("INSERT INTO filter_state SELECT trajectory_id, 'bench', true, num_turns FROM trajectories")
        con.execute("DROP TABLE generated")
        con.unregister("base")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def per_turn_python(store: Store, config, limit: int | None) -> tuple[int, float, float, dict]:
    """The straightforward path: fetch, score each turn in Python, write back in one Arrow insert."""
    wall, cpu = time.perf_counter(), cpu_seconds()
    sql = "SELECT trajectory_id, turn_index, action, observation FROM kept_turns ORDER BY trajectory_id, turn_index"
    cursor = store.connection.execute(sql + (f" LIMIT {limit}" if limit else ""))
    rows = []
    while batch := cursor.fetchmany(10_000):
        for trajectory_id, turn_index, action, observation in batch:
            scored = score_turn(action, observation, config.score)
            m = scored.metrics
            metrics = (m.overlap, m.novelty, m.jaccard, m.length_ratio)
            rows.append((trajectory_id, turn_index, *metrics, scored.category, scored.keep_ratio))
    categories = [row[6] for row in rows]
    with store.transaction() as con:
        con.register("python_scores", pa.table(list(zip(*rows, strict=True)), names=SCORE_COLUMNS))
        con.execute("CREATE TABLE baseline_scores AS SELECT * FROM python_scores")
        con.unregister("python_scores")
    return len(rows), time.perf_counter() - wall, cpu_seconds() - cpu, Counter(categories)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1_000_000)
    parser.add_argument(
        "--python-turns", type=int, default=None, help="Time the per-turn path on this many turns only."
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="simulacra-bench-score-") as tmp:
        config = load_config(None, [{"workspace": {"path": tmp}}])
        with Store(Path(tmp) / "bench.duckdb") as store:
            started = time.perf_counter()
            fill(store, args.turns)
            turns, action_chars, observation_chars = store.connection.execute(
                "SELECT count(*), avg(length(action)), avg(length(observation)) FROM kept_turns"
            ).fetchone()
            threads = store.scalar("SELECT current_setting('threads')")
            generated = time.perf_counter() - started
            print(
                f"{turns:,} synthetic turns (mean action {action_chars:.0f} chars, observation "
                f"{observation_chars:.0f}), generated in {generated:.1f}s; DuckDB threads {threads}, polars threads "
                f"{pl.thread_pool_size()}, "
                f"load average {os.getloadavg()[0]:.1f}"
            )

            wall, cpu = time.perf_counter(), cpu_seconds()
            result = score_stage.run(config, store)
            bulk_wall, bulk_cpu = time.perf_counter() - wall, cpu_seconds() - cpu
            assert result.metrics["turns_scored"] == turns

            py_turns, py_wall, py_cpu, py_categories = per_turn_python(store, config, args.python_turns)
            disagree = store.scalar(
                "SELECT count(*) FROM baseline_scores b JOIN turn_scores s USING (trajectory_id, turn_index) "
                "WHERE b.category <> s.category OR b.keep_ratio <> s.keep_ratio"
            )
        scale = turns / py_turns
        note = "" if py_turns == turns else f"   [timed on {py_turns:,} turns, extrapolated x{scale:.1f}]"
        ratio = py_wall * scale / bulk_wall
        per_million = bulk_wall * 1_000_000 / turns
        print(
            f"bulk      (stages.score.run): {bulk_wall:7.1f}s wall {turns / bulk_wall:>9,.0f} turns/s  "
            f"CPU {bulk_cpu:.1f}s"
        )
        print(
            f"per-turn  (score_turn loop):  {py_wall * scale:7.1f}s wall {py_turns / py_wall:>9,.0f} turns/s  "
            f"CPU {py_cpu * scale:.1f}s{note}"
        )
        print(
            f"ratio: {ratio:.1f}x wall, {py_cpu * scale / bulk_cpu:.1f}x CPU; "
            f"load average after {os.getloadavg()[0]:.1f}"
        )
        print(
            f"targets: >= 5x the per-turn path: {'met' if ratio >= 5 else 'NOT met'}; "
            f"1M turns in under 60 s: {'met' if per_million < 60 else 'NOT met'} ({per_million:.1f}s per 1M)"
        )
        shares = ", ".join(f"{c} {n / py_turns:.1%}" for c, n in py_categories.most_common())
        print(f"categories: {shares}")
        print(f"agreement: {py_turns - disagree:,} of {py_turns:,} turns with the same category and keep ratio")


if __name__ == "__main__":
    main()
