"""The split stage on a real DuckDB file: disjoint pools, stability, targets per pool, drops, config changes."""

import json
from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.config import SimulacraConfig, load_config
from pipeline.config.split import POOLS
from pipeline.errors import UserFixableError
from pipeline.store.database import Store
from stages import split as split_stage


def add_trajectories(
    store: Store,
    ids: list[str],
    turns: int | list[int] = 6,
    domain: str = "terminal",
    tasks: list[str | None] | None = None,
    metadata: list[dict | None] | None = None,
    source: str = "bench",
) -> None:
    """Kept trajectories as ingest and filter write them, each with `turns` turns (`ls i` -> `out i`)."""
    counts = turns if isinstance(turns, list) else [turns] * len(ids)
    tasks = tasks or [None] * len(ids)
    metadata = [None if m is None else json.dumps(m) for m in metadata or [None] * len(ids)]
    with store.transaction() as con:
        con.register("added", pa.table({"trajectory_id": ids, "n": counts, "task": tasks, "metadata": metadata}))
        con.execute(
            "INSERT INTO trajectories (trajectory_id, source, format, domain, task, task_description, num_turns, "
            "metadata, location, ingested_at) SELECT trajectory_id, ?, 'simulacra-jsonl', ?, task, 'simulate', n, "
            "metadata::JSON, 'test', now() FROM added",
            [source, domain],
        )
        con.execute(
            "INSERT INTO turns SELECT trajectory_id, i, 'ls ' || i, 'out ' || i, NULL, false, NULL "
            "FROM (SELECT trajectory_id, unnest(range(n)) AS i FROM added)"
        )
        con.execute("INSERT INTO filter_state SELECT trajectory_id, 'filter-v1', true, n FROM added")
        con.unregister("added")


def add_trajectory(store: Store, trajectory_id: str, task: str, pairs: list[tuple[str, str]], domain: str) -> None:
    """One kept trajectory with the given (action, observation) turns."""
    with store.transaction() as con:
        con.execute(
            "INSERT INTO trajectories (trajectory_id, source, format, domain, task, task_description, num_turns, "
            "location, ingested_at) VALUES (?, 'bench', 'simulacra-jsonl', ?, ?, 'simulate', ?, 'test', now())",
            [trajectory_id, domain, task, len(pairs)],
        )
        for index, (action, observation) in enumerate(pairs):
            con.execute(
                "INSERT INTO turns VALUES (?, ?, ?, ?, NULL, false, NULL)", [trajectory_id, index, action, observation]
            )
        con.execute("INSERT INTO filter_state VALUES (?, 'filter-v1', true, ?)", [trajectory_id, len(pairs)])


def configured(tmp_path: Path, **split) -> SimulacraConfig:
    return load_config(None, [{"workspace": {"path": str(tmp_path / "workspace")}, "split": split}])


def only(pool: str) -> dict:
    """Ratios that send every trajectory to one pool."""
    return {"ratios": {p: 1.0 if p == pool else 0.0 for p in POOLS}}


def pools(store: Store) -> dict[str, str]:
    return dict(store.connection.execute("SELECT trajectory_id, pool FROM splits").fetchall())


def group_keys(store: Store) -> dict[str, str]:
    return dict(store.connection.execute("SELECT trajectory_id, group_key FROM splits").fetchall())


def targets(store: Store) -> dict[str, list[int]]:
    rows = store.connection.execute(
        "SELECT trajectory_id, list(turn_index ORDER BY turn_index) FROM targets GROUP BY trajectory_id"
    ).fetchall()
    return dict(rows)


def test_every_kept_trajectory_in_exactly_one_pool(config: SimulacraConfig, store: Store) -> None:
    ids = [f"t{i:04d}" for i in range(2000)]
    add_trajectories(store, ids, turns=3)
    add_trajectories(store, ["dropped"], turns=3)
    store.execute("UPDATE filter_state SET kept = false WHERE trajectory_id = 'dropped'")
    result = split_stage.run(config, store)
    placed = pools(store)
    assert sorted(placed) == ids  # the dropped trajectory is in no pool
    members = {pool: {t for t, p in placed.items() if p == pool} for pool in POOLS}
    for i, a in enumerate(POOLS):
        for b in POOLS[i + 1 :]:
            assert not members[a] & members[b], (a, b)
    # Placement is the documented formula: the md5 position of the group key against the cumulative
    # ratios; a trajectory with no task or metadata is a group of its own.
    r = config.split.ratios
    bounds = [r.cpt, r.cpt + r.sft, r.cpt + r.sft + r.rl, r.cpt + r.sft + r.rl + r.val]
    assert group_keys(store) == {t: f"trajectory_id:{t}" for t in ids}
    for t, pool in placed.items():
        position = split_stage.pool_position(config.split.salt, f"trajectory_id:{t}")
        assert pool == POOLS[sum(position >= b for b in bounds)]
    for pool, share in config.split.ratios.model_dump().items():
        assert len(members[pool]) / len(ids) == pytest.approx(share, abs=0.03), pool
        assert result.metrics[f"{pool}_trajectories"] == len(members[pool])
    assert not targets(store).keys() & members["cpt"]  # the whole cpt trajectory trains: no targets


DEFAULT_GROUPS = ["metadata.task_id", "metadata.instance_id", "task"]

# (task, metadata, split.group_by, expected group key; `ID` stands for the trajectory id)
GROUP_KEYS = [
    ("Fix the crash", {"task_id": 3, "trial": 1}, DEFAULT_GROUPS, "metadata.task_id:3"),  # tau-bench: task id, not text
    ("Fix the crash", {"task_id": 0}, DEFAULT_GROUPS, "metadata.task_id:0"),  # a number is its JSON text, 0 included
    (
        "Fix the crash",
        {"instance_id": "astropy__astropy-12907"},
        DEFAULT_GROUPS,
        "metadata.instance_id:astropy__astropy-12907",
    ),
    ("Fix the crash", {"task_id": None, "instance_id": ""}, DEFAULT_GROUPS, "task:Fix the crash"),  # null, empty: unset
    ("  put a clean mug in shelf.\n", None, DEFAULT_GROUPS, "task:put a clean mug in shelf."),  # outer space stripped
    # Spaces at a line's end (SWE-agent's configurations differ so inside one issue's instructions), CRLF too.
    (
        "Fix bug 42.\nRun the tests. \r\nThen submit.\t\n",
        None,
        DEFAULT_GROUPS,
        "task:Fix bug 42.\nRun the tests.\nThen submit.",
    ),
    (" \t\n", {"task_id": "  "}, DEFAULT_GROUPS, "trajectory_id:ID"),  # all blank: its own group
    (None, None, DEFAULT_GROUPS, "trajectory_id:ID"),
    (
        "Fix the crash",
        {"env": {"repo": "django/django"}},
        ["metadata.env.repo", "task"],
        "metadata.env.repo:django/django",
    ),
    ("Fix the crash", {"env": {"repo": "django/django"}}, ["task", "metadata.env.repo"], "task:Fix the crash"),  # order
    ("Fix the crash", {"env": {"repo": ["a", "b"]}}, ["metadata.env.repo"], 'metadata.env.repo:["a","b"]'),
    ("Fix the crash", {"task_id": 3}, ["metadata.repo"], "trajectory_id:ID"),  # no listed field set
]


@pytest.mark.parametrize(("task", "metadata", "group_by", "expected"), GROUP_KEYS)
def test_group_key_is_the_first_set_field_else_the_trajectory(tmp_path, task, metadata, group_by, expected) -> None:
    config = configured(tmp_path, group_by=group_by)
    with Store(config.workspace.database_path) as store:
        add_trajectories(store, ["t1"], tasks=[task], metadata=[metadata])
        split_stage.run(config, store)
        assert group_keys(store) == {"t1": expected.replace("ID", "t1")}


@pytest.mark.parametrize(
    ("group_by", "reason"),
    [
        ([], "at least 1 item"),
        (["metadata"], "group field 'metadata'"),
        (["trajectory_id"], "expected `task` or `metadata"),
        (["metadata.a b"], "group field 'metadata.a b'"),
    ],
)
def test_group_fields_are_checked(group_by: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        load_config(None, [{"split": {"group_by": group_by}}])


def test_runs_of_one_task_share_a_pool_so_eval_repeats_no_training_pair(config: SimulacraConfig, store: Store) -> None:
    """Issue 13: 120 runs of 27 terminal tasks put 102 of 212 eval targets verbatim in the cpt pool
    when trajectories were placed one by one. Here 60 tasks of 5 runs each, whose turns repeat
    within a task (`ls i` -> `out i` with the task in the text) and never across tasks."""
    tasks = [f"task {i}" for i in range(60)]
    ids = [f"{task}/run {run}" for task in tasks for run in range(5)]
    add_trajectories(store, ids, turns=6, tasks=[t.split("/")[0] for t in ids])
    store.execute(
        "UPDATE turns SET action = split_part(trajectory_id, '/', 1) || ': ' || action, "
        "observation = split_part(trajectory_id, '/', 1) || ': ' || observation"
    )
    split_stage.run(config, store)
    placed, keys = pools(store), group_keys(store)
    assert all(keys[t] == "task:" + t.split("/")[0] for t in ids)
    for task in tasks:
        assert len({placed[f"{task}/run {run}"] for run in range(5)}) == 1, task
    assert {placed[t] for t in ids} == set(POOLS)  # tasks still spread over every pool
    [overlap] = split_stage.overlap_report(store)
    assert overlap["eval_targets"] > 0 and overlap["in_training"] == 0


def test_a_new_run_of_a_known_task_joins_its_pool(config: SimulacraConfig, store: Store) -> None:
    add_trajectories(store, [f"a{i:03d}" for i in range(200)], tasks=[f"task {i % 40}" for i in range(200)])
    split_stage.run(config, store)
    before = pools(store)
    add_trajectories(store, [f"b{i:03d}" for i in range(40)], tasks=[f"task {i}" for i in range(40)])
    grown = split_stage.run(config, store)
    after = pools(store)
    assert grown.metrics["trajectories_assigned"] == 40 and grown.metrics["assignments_removed"] == 0
    assert {t: after[t] for t in before} == before
    assert all(after[f"b{i:03d}"] == before[f"a{i:03d}"] for i in range(40))  # a{i} ran task i too


def test_adding_data_moves_nothing_and_rerun_changes_nothing(config: SimulacraConfig, store: Store) -> None:
    first = [f"a{i:03d}" for i in range(300)]
    add_trajectories(store, first)
    split_stage.run(config, store)
    before = store.rows("SELECT * FROM splits ORDER BY trajectory_id")
    before_targets = store.rows("SELECT * FROM targets ORDER BY ALL")
    again = split_stage.run(config, store)
    assert again.metrics["trajectories_assigned"] == 0 and again.metrics["targets_added"] == 0
    add_trajectories(store, [f"b{i:03d}" for i in range(300)])
    grown = split_stage.run(config, store)
    assert grown.metrics["trajectories_assigned"] == 300 and grown.metrics["assignments_removed"] == 0
    assert store.rows("SELECT * FROM splits WHERE trajectory_id < 'b' ORDER BY trajectory_id") == before
    assert store.rows("SELECT * FROM targets WHERE trajectory_id < 'b' ORDER BY ALL") == before_targets


def test_rl_takes_exactly_one_kept_turn(tmp_path: Path) -> None:
    config = configured(tmp_path, **only("rl"))
    with Store(config.workspace.database_path) as store:
        ids = [f"r{i:03d}" for i in range(200)]
        add_trajectories(store, ids, turns=[2 + i % 9 for i in range(200)])
        store.execute(
            "INSERT INTO filter_decisions SELECT trajectory_id, 0, 'retry_cycle', 'test', 'f', now() FROM trajectories"
        )
        split_stage.run(config, store)
        chosen = targets(store)
        assert sorted(chosen) == ids and all(len(turns) == 1 for turns in chosen.values())
        assert all(turns[0] != 0 for turns in chosen.values())  # never a dropped turn
        assert len({turns[0] for turns in chosen.values()}) > 3  # seeded per trajectory, not always the same index
        assert store.scalar("SELECT count(*) FROM targets WHERE strategy <> 'one' OR pool <> 'rl'") == 0


@pytest.mark.parametrize(("kept", "expected"), [(1, [0]), (2, [0, 1]), (5, [0, 1, 2, 3, 4]), (6, None), (12, None)])
def test_eval_takes_first_last_and_up_to_three_middle(tmp_path: Path, kept: int, expected: list[int] | None) -> None:
    config = configured(tmp_path, **only("eval"))
    with Store(config.workspace.database_path) as store:
        ids = [f"e{i:02d}" for i in range(30)]
        add_trajectories(store, ids, turns=kept)
        split_stage.run(config, store)
        for turns in targets(store).values():
            if expected is not None:
                assert turns == expected
            else:
                assert turns[0] == 0 and turns[-1] == kept - 1 and len(turns) == 5
        if expected is None:
            assert len({tuple(t) for t in targets(store).values()}) > 1  # middle turns differ by trajectory


def test_sft_takes_every_kept_turn(tmp_path: Path) -> None:
    config = configured(tmp_path, **only("sft"))
    with Store(config.workspace.database_path) as store:
        add_trajectories(store, ["s1", "s2"], turns=4)
        store.execute("INSERT INTO filter_decisions VALUES ('s1', 2, 'retry_cycle', 'test', 'f', now())")
        split_stage.run(config, store)
        assert targets(store) == {"s1": [0, 1, 3], "s2": [0, 1, 2, 3]}


def test_targets_depend_on_the_trajectory_and_seed_alone(tmp_path: Path) -> None:
    chosen = []
    for name, others, seed in (("one", 0, 0), ("two", 50, 0), ("three", 0, 1)):
        config = configured(tmp_path / name, seed=seed, **only("eval"))
        with Store(config.workspace.database_path) as store:
            add_trajectories(store, ["probe"] + [f"other{i}" for i in range(others)], turns=20)
            split_stage.run(config, store)
            chosen.append(targets(store)["probe"])
            assert store.scalar("SELECT any_value(seed) FROM targets") == seed
    assert chosen[0] == chosen[1] and chosen[0] != chosen[2]


def test_dropped_trajectories_and_turns_leave_splits_and_targets(tmp_path: Path) -> None:
    config = configured(tmp_path, **only("sft"))
    with Store(config.workspace.database_path) as store:
        add_trajectories(store, ["keep", "drop"], turns=3)
        split_stage.run(config, store)
        store.execute("UPDATE filter_state SET kept = false WHERE trajectory_id = 'drop'")
        store.execute("INSERT INTO filter_decisions VALUES ('keep', 1, 'retry_cycle', 'test', 'f', now())")
        result = split_stage.run(config, store)
        assert pools(store) == {"keep": "sft"} and targets(store) == {"keep": [0, 2]}
        assert result.metrics["assignments_removed"] == 1 and result.metrics["targets_removed"] == 4


def test_changed_config_reassigns_everything_at_once(config: SimulacraConfig, store: Store, tmp_path: Path) -> None:
    add_trajectories(store, [f"c{i:03d}" for i in range(400)], turns=8)
    split_stage.run(config, store)
    before = pools(store)
    reseeded = configured(tmp_path, seed=7)
    result = split_stage.run(reseeded, store)
    assert pools(store) == before  # the seed picks targets, not pools
    assert result.metrics["targets_removed"] > 0
    assert store.scalar("SELECT count(DISTINCT config_hash) FROM splits") == 1
    assert store.scalar("SELECT any_value(config_hash) FROM targets") == reseeded.section_hash("split")
    resalted = configured(tmp_path, salt="another-project")
    split_stage.run(resalted, store)
    moved = sum(pools(store)[t] != p for t, p in before.items())
    assert moved > 100 and len(pools(store)) == 400
    assert store.scalar("SELECT count(*) FROM splits WHERE config_hash <> ?", [resalted.section_hash("split")]) == 0


def test_a_changed_group_by_reassigns_every_pool_at_once(config: SimulacraConfig, store: Store, tmp_path: Path) -> None:
    ids = [f"g{i:03d}" for i in range(400)]
    add_trajectories(
        store,
        ids,
        tasks=[f"task {i % 20}" for i in range(400)],
        metadata=[{"repo": f"repo {i % 100}"} for i in range(400)],
    )
    split_stage.run(config, store)
    assert len(set(group_keys(store).values())) == 20
    by_repo = configured(tmp_path, group_by=["metadata.repo"])
    result = split_stage.run(by_repo, store)
    assert result.metrics["assignments_removed"] == 400 and result.metrics["trajectories_assigned"] == 400
    assert set(group_keys(store).values()) == {f"metadata.repo:repo {i}" for i in range(100)}
    assert store.scalar("SELECT count(*) FROM splits WHERE config_hash <> ?", [by_repo.section_hash("split")]) == 0
    assert store.scalar("SELECT count(DISTINCT pool) FROM splits GROUP BY group_key ORDER BY 1 DESC LIMIT 1") == 1


def test_rows_without_a_group_key_are_replaced(config: SimulacraConfig, store: Store) -> None:
    """Rows written before migration 3 have no group key: the next run replaces them."""
    add_trajectories(store, ["old", "new"], tasks=["a task", "a task"])
    split_stage.run(config, store)
    store.execute("UPDATE splits SET group_key = NULL WHERE trajectory_id = 'old'")
    result = split_stage.run(config, store)
    assert result.metrics["assignments_removed"] == 1 and result.metrics["trajectories_assigned"] == 1
    assert group_keys(store) == {"old": "task:a task", "new": "task:a task"}


def task_in(pool: str, config: SimulacraConfig, prefix: str) -> str:
    """A task name whose group the default salt and ratios send to `pool`."""
    r = config.split.ratios
    bounds = [r.cpt, r.cpt + r.sft, r.cpt + r.sft + r.rl, r.cpt + r.sft + r.rl + r.val]
    for i in range(10_000):
        name = f"{prefix} {i}"
        if POOLS[sum(split_stage.pool_position(config.split.salt, f"task:{name}") >= b for b in bounds)] == pool:
            return name
    raise AssertionError(pool)


def test_overlap_report_counts_eval_targets_seen_verbatim_in_training(config: SimulacraConfig, store: Store) -> None:
    # The environment repeats itself across tasks: the same drawer is closed in every game.
    closed = ("go to drawer 1", "The drawer 1 is closed.")
    add_trajectory(
        store,
        "eval",
        task_in("eval", config, "eval"),
        domain="text-game",
        pairs=[
            closed,  # in cpt and sft
            ("open drawer 1", "You open the drawer 1. In it, you see a key."),  # action seen, answer differs
            ("take key 1", "You pick up the key 1."),  # in rl
            ("inventory", "You carry a key."),  # new
        ],
    )
    add_trajectory(
        store,
        "train-cpt",
        task_in("cpt", config, "cpt"),
        domain="text-game",
        pairs=[closed, ("open drawer 1", "You open the drawer 1. In it, you see nothing.")],
    )
    add_trajectory(
        store, "train-sft", task_in("sft", config, "sft"), domain="text-game", pairs=[("look", "A room."), closed]
    )
    add_trajectory(
        store,
        "train-rl",
        task_in("rl", config, "rl"),
        domain="text-game",
        pairs=[("take key 1", "You pick up the key 1."), ("look", "A room.")],
    )
    # A pair of another eval trajectory is not training data; nor is a turn the filter dropped.
    add_trajectory(
        store,
        "eval-2",
        task_in("eval", config, "eval-2"),
        domain="text-game",
        pairs=[("inventory", "You carry a key.")],
    )
    add_trajectory(
        store,
        "train-dropped",
        task_in("cpt", config, "dropped"),
        domain="text-game",
        pairs=[("look", "A room."), ("inventory", "You carry a key.")],
    )
    store.execute("INSERT INTO filter_decisions VALUES ('train-dropped', 1, 'retry_cycle', 'test', 'f', now())")
    result = split_stage.run(config, store)
    assert pools(store) == {
        "eval": "eval",
        "eval-2": "eval",
        "train-cpt": "cpt",
        "train-sft": "sft",
        "train-rl": "rl",
        "train-dropped": "cpt",
    }
    [row] = result.tables["eval overlap"]
    assert row == {
        "domain": "text-game",
        "eval_targets": 5,
        "in_training": 2,
        "share_in_training": 0.4,
        "in_cpt": 1,
        "in_sft": 1,
        "in_rl": 1,
    }
    assert result.metrics["eval_targets_in_training"] == 2 and result.metrics["eval_overlap.text-game"] == 0.4
    assert "eval targets verbatim in a training pool: 2 of 5 (text-game 40.0%)" in result.summary


def test_pool_report(config: SimulacraConfig, store: Store) -> None:
    add_trajectories(store, [f"p{i:03d}" for i in range(100)], turns=4)
    add_trajectories(store, [f"q{i:03d}" for i in range(100)], turns=3, domain="mcp")
    result = split_stage.run(config, store)
    report = split_stage.pool_report(store)
    assert result.tables["pools"] == report
    assert [r["pool"] for r in report] == sorted((r["pool"] for r in report), key=POOLS.index)
    assert sum(r["trajectories"] for r in report) == 200
    assert sum(r["turns"] for r in report) == 100 * 4 + 100 * 3
    for row in report:
        per_trajectory = 4 if row["domain"] == "terminal" else 3
        assert row["turns"] == row["trajectories"] * per_trajectory
        assert row["groups"] == row["trajectories"]  # no task: each trajectory its own group
        expected = {"cpt": 0, "sft": per_trajectory, "rl": 1, "val": per_trajectory, "eval": per_trajectory}[
            row["pool"]
        ]
        assert row["targets"] == row["trajectories"] * expected


def test_a_thought_is_never_a_target(tmp_path: Path) -> None:
    """Issue 13: a turn of kind `thought` (ReAct's `think:`) stays in the history but is never a
    target: the selection runs over the other kept turns, so eval's first and last are turns the
    environment answered, and RL's one turn is never a thought."""
    for pool in ("sft", "rl", "eval"):
        config = configured(tmp_path / pool, **only(pool))
        with Store(config.workspace.database_path) as store:
            ids = [f"t{i:03d}" for i in range(200)]
            add_trajectories(store, ids, turns=8)
            # Thoughts at the start, the end and in the middle of every trajectory.
            store.execute("""UPDATE turns SET metadata = '{"kind": "thought"}' WHERE turn_index IN (0, 3, 7)""")
            split_stage.run(config, store)
            chosen = targets(store)
            assert sorted(chosen) == ids, pool
            assert all(not {0, 3, 7} & set(turns) for turns in chosen.values()), pool
            if pool == "sft":
                assert all(turns == [1, 2, 4, 5, 6] for turns in chosen.values())
            if pool == "rl":
                assert all(len(turns) == 1 for turns in chosen.values())
            if pool == "eval":  # the first and last environment turns are 1 and 6; all 3 middle ones fit
                assert all(turns == [1, 2, 4, 5, 6] for turns in chosen.values())


def test_react_alfworld_thoughts_are_context_never_targets_nor_labels(public_data: Path, tmp_path: Path) -> None:
    """The public ReAct ALFWorld file: 481 actions over 36 games, 91 of them `think:` (89 answered
    "OK.", 2 with nothing after them in the few-shot log). Every thought stays a kept turn (history
    for the next action), scores `thought` with keep ratio 0 (before: `action` or `other`, keep 1),
    and is never an SFT target; every other kept turn is."""
    from stages import filter as filter_stage
    from stages import ingest
    from stages import score as score_stage

    config = configured(tmp_path, **only("sft"))
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store, paths=[str(public_data / "react_alfworld")])
        filter_stage.run(config, store)
        score_stage.run(config, store)
        split_stage.run(config, store)
        kind = "json_extract_string(metadata, '$.kind')"
        assert store.scalar("SELECT count(*) FROM turns") == 481
        assert store.scalar(f"SELECT count(*) FROM kept_turns WHERE {kind} = 'thought'") == 91
        thoughts = store.rows(
            "SELECT category, keep_ratio, count(*) AS turns FROM turn_scores JOIN turns USING (trajectory_id, turn_index) "
            f"WHERE {kind} = 'thought' GROUP BY ALL"
        )
        assert thoughts == [{"category": "thought", "keep_ratio": 0.0, "turns": 91}]
        assert store.scalar("SELECT count(*) FROM turn_scores WHERE category = 'thought'") == 91
        kept = store.scalar("SELECT count(*) FROM kept_turns")
        assert store.scalar("SELECT count(*) FROM targets") == kept - 91
        assert (
            store.scalar(
                f"SELECT count(*) FROM targets JOIN turns USING (trajectory_id, turn_index) WHERE {kind} = 'thought'"
            )
            == 0
        )


def test_the_validation_pool_is_carved_from_the_training_side_and_moves_no_eval_trajectory(tmp_path):
    """Issue 28: the val pool takes its share from the training pools' end of [0, 1); the eval pool is the
    same last tenth it was with the four-pool ratios (0.55 / 0.2 / 0.15 / 0.1), so no eval number moved."""
    ids = [f"v{i:03d}" for i in range(300)]
    placed = {}
    for name, ratios in (("four", {"cpt": 0.55, "sft": 0.2, "rl": 0.15, "val": 0.0, "eval": 0.1}), ("five", None)):
        config = configured(tmp_path / name, **({"ratios": ratios} if ratios else {}))
        with Store(config.workspace.database_path) as store:
            add_trajectories(store, ids, turns=5)
            split_stage.run(config, store)
            placed[name] = pools(store)
            if ratios is None:
                targets = store.rows("SELECT pool, count(*) AS n FROM targets GROUP BY pool")
    evals = {name: {t for t, p in found.items() if p == "eval"} for name, found in placed.items()}
    assert evals["four"] == evals["five"] and evals["five"]
    val = {t for t, p in placed["five"].items() if p == "val"}
    assert val and all(placed["four"][t] in ("cpt", "sft", "rl") for t in val)
    # Validation targets are chosen as eval's: the first, the last and up to three middle turns.
    assert {row["pool"]: row["n"] for row in targets}["val"] == len(val) * 5


def test_a_held_out_source_is_validation_only_and_moves_no_eval_trajectory(tmp_path):
    """`split.val_sources`: a whole environment no training pool holds. Its groups in eval's slice stay there,
    its others go to val; a group it shares with another source goes with it; the rest is placed as before."""
    bench = [f"b{i:03d}" for i in range(200)]
    held = [f"h{i:03d}" for i in range(100)]
    # h000-h019 share their task with b000-b019: one group across the two sources.
    bench_tasks = [f"task {i}" if i < 20 else None for i in range(200)]
    held_tasks = [f"task {i}" if i < 20 else None for i in range(100)]
    placed, summaries = {}, {}
    for name, split in (("plain", {}), ("held", {"val_sources": ["held", "held"]})):
        config = configured(tmp_path / name, **split)
        with Store(config.workspace.database_path) as store:
            add_trajectories(store, bench, turns=4, tasks=bench_tasks)
            add_trajectories(store, held, turns=4, tasks=held_tasks, source="held")
            result = split_stage.run(config, store)
            placed[name], summaries[name] = pools(store), result.summary
            if name == "held":
                assert result.metrics["val_sources"] == "held"
                val_targets = store.scalar("SELECT count(*) FROM targets WHERE pool = 'val'")
    plain, with_held = placed["plain"], placed["held"]
    assert {t for t, p in plain.items() if p == "eval"} == {t for t, p in with_held.items() if p == "eval"}
    assert {with_held[t] for t in held} == {"val", "eval"}
    assert all(with_held[t] == "val" for t in held if plain[t] != "eval")
    # The shared groups went with the held-out source; every other bench trajectory kept its pool.
    shared = {f"b{i:03d}" for i in range(20)}
    assert all(with_held[t] == with_held[f"h{t[1:]}"] for t in shared)
    assert any(plain[t] in ("cpt", "sft", "rl") and with_held[t] == "val" for t in shared)
    assert all(with_held[t] == plain[t] for t in bench if t not in shared)
    assert val_targets == 4 * sum(1 for p in with_held.values() if p == "val")  # first, last, both middles
    assert "held out for val (no training pool holds them): held" in summaries["held"]
    assert "held out" not in summaries["plain"]


def test_a_held_out_source_that_holds_nothing_is_refused_with_the_sources_there(tmp_path):
    config = configured(tmp_path, val_sources=["helt"])
    with Store(config.workspace.database_path) as store:
        add_trajectories(store, ["a1", "a2"])
        with pytest.raises(UserFixableError, match=r"split.val_sources: no kept trajectory comes from 'helt'.*'bench'"):
            split_stage.run(config, store)
        assert store.scalar("SELECT count(*) FROM splits") == 0
