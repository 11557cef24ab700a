"""Runs of one task that open alike ask one query: the measuring sets ask it once.

Three runs of a task that make the same first call and get the same answer give three target turns
with one content (system prompt, history, action, observation). The validation targets and the eval
pool pass the repeats over, in rank order, and fill their budget from the next targets, so no answer
counts twice in a mean or its interval. Real files: JSONL ingested into a real DuckDB store, filtered,
scored and split by the stages, the pool read back from its snapshot."""

import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.sft.queries import choose_targets, content_key, distinct_queries, load_queries
from pipeline.store.database import Store
from pipeline.store.snapshot import export_snapshot, target_turns
from stages import filter as filter_stage
from stages import ingest, score, split

TASKS, RUNS = 4, 3


def _runs() -> list[dict]:
    """Each task's runs share their first two turns (same calls, same answers), then part ways."""
    rows = []
    for task in range(TASKS):
        for run in range(RUNS):
            turns = [
                (f"ls /srv/task{task}", f"app{task}.py data{task}.csv"),
                (f"head -1 data{task}.csv", f"id,value,task{task}"),
                (f"python app{task}.py --run {run}", f"run {run} of task {task}: {run * 7 + task} rows written"),
                (f"wc -l out{task}-{run}.csv", f"{run * 7 + task} out{task}-{run}.csv"),
            ]
            rows.append(
                {
                    "schema": "simulacra/trajectory-v1",
                    "domain": "terminal",
                    "task": f"task-{task}",
                    "system": {"task_description": f"Process the data of task {task}."},
                    "turns": [{"action": a, "observation": o} for a, o in turns],
                }
            )
    return rows


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("repeats")
    data = root / "runs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _runs()))
    return root


def _split_into(root: Path, pool: str, **sections):
    """Every trajectory in `pool`, every kept turn a target of it."""
    ratios = {name: 0.0 for name in ("cpt", "sft", "rl", "val", "eval")} | {pool: 1.0}
    config = load_config(
        None,
        [
            {
                "workspace": {"path": str(root / pool)},
                "filter": {"min_turns": 1},
                "split": {"ratios": ratios, f"{pool}_targets": {"strategy": "all"}},
                **sections,
            }
        ],
    )
    store = Store(config.workspace.database_path)
    ingest.run(config, store, paths=[str(root / "runs.jsonl")])
    filter_stage.run(config, store)
    score.run(config, store)
    split.run(config, store)
    return config, store


def test_the_pool_repeats_itself_and_distinct_queries_ask_each_content_once(workspace):
    config, store = _split_into(workspace, "val")
    with store:
        ranked = choose_targets(target_turns(store, "val"), None, 0)
        snapshot = export_snapshot(store, workspace / "val-snapshot", ("val",))
    every = load_queries(snapshot, "val", ranked, 10_000)
    assert len(every) == TASKS * RUNS * 4
    distinct = {content_key(q) for q in every}
    assert len(distinct) == TASKS * (2 + 2 * RUNS)  # each task's two shared turns, each run's own two

    for budget in (5, 12, len(distinct), len(distinct) + 5):
        chosen, repeats = distinct_queries(snapshot, "val", ranked, budget, 10_000)
        keys = [content_key(q) for q in chosen]
        assert len(keys) == len(set(keys)) == min(budget, len(distinct))
        # In rank order: each chosen is the first of its content, and nothing distinct before it was skipped.
        first_of = {}
        for q in every:
            first_of.setdefault(content_key(q), q.query_id)
        firsts = [q.query_id for q in every if first_of[content_key(q)] == q.query_id]
        assert [q.query_id for q in chosen] == firsts[: len(chosen)]
        assert repeats == sum(1 for q in every[: every.index(chosen[-1]) + 1] if first_of[content_key(q)] != q.query_id)


def test_validation_and_evaluation_ask_no_query_twice(workspace):
    from pipeline.training import validation
    from stages.evaluate import build_eval_set

    config, store = _split_into(workspace, "val", validation={"max_queries": 20})
    with store:
        snapshot = export_snapshot(store, workspace / "val-snapshot-2", ("val",))
        targets = validation.choose(store, config, snapshot)
    assert len(targets) == 20
    queries = load_queries(snapshot, "val", targets, config.validation.max_history_chars)
    assert len({content_key(q) for q in queries}) == 20

    config, store = _split_into(workspace, "eval", evaluate={"max_queries": 30})
    with store:
        eval_set, _ = build_eval_set(config, store, None)
    assert len(eval_set.queries) == len({content_key(q) for q in eval_set.queries}) == 30
    assert "repeating another's query passed over" in eval_set.name
