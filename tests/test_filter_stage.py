"""The filter stage on a real DuckDB file: decisions with reasons, views, reruns, config changes, kills."""

import duckdb
import orjson
import pytest

from pipeline.config import SimulacraConfig
from pipeline.store.database import Store
from pipeline.store.schema import SystemPrompt, Trajectory, Turn
from stages import filter as filter_stage

TOOLS = [{"type": "function", "function": {"name": "search"}}]


def make(
    name: str, *turns: tuple, domain: str = "terminal", source: str = "bench", tools: list | None = None
) -> Trajectory:
    """A trajectory whose content (and so its id) is unique to `name`."""
    return Trajectory(
        source=source,
        domain=domain,
        turns=[Turn(action, observation, tool_name) for action, observation, tool_name in turns],
        system=SystemPrompt(f"simulate {name}", tools=tools or []),
        location=f"test:{name}",
    )


def ok(n: int) -> tuple:
    return (f"echo {n}", f"{n}", None)


def insert(store: Store, *trajectories: Trajectory) -> list[str]:
    """Rows as ingest writes them (migration 1's columns); returns the ids."""
    ids = []
    with store.transaction() as con:
        for t in trajectories:
            trajectory_id = t.content_id()
            ids.append(trajectory_id)
            con.execute(
                "INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, tools, num_turns, "
                "location, ingested_at) VALUES (?, ?, 'simulacra-jsonl', ?, ?, ?, ?, ?, now())",
                [
                    trajectory_id,
                    t.source,
                    t.domain,
                    t.system.task_description,
                    orjson.dumps(t.system.tools).decode() if t.system.tools else None,
                    len(t.turns),
                    t.location,
                ],
            )
            con.executemany(
                "INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, NULL)",
                [[trajectory_id, i, u.action, u.observation, u.tool_name, u.is_error] for i, u in enumerate(t.turns)],
            )
    return ids


# name -> (trajectory, kept?, {turn index: rule} of turn-level drops, trajectory-level rule or None)
CORPUS = {
    "clean": (make("clean", ok(1), ok(2), ok(3)), True, {}, None),
    "single": (make("single", ok(1)), False, {}, "min_turns"),
    "captcha": (
        make("captcha", ok(1), ("open", "Please verify you are a human", None), domain="web"),
        False,
        {},
        "environment_failure",
    ),
    "retry": (
        make("retry", ok(1), ("lss", "Error: invalid action", None), ok(2), ok(3)),
        True,
        {1: "retry_cycle"},
        None,
    ),
    "empty then short": (make("empty then short", ok(1), ("  ", "$", None)), False, {1: "empty_action"}, "min_turns"),
    "undeclared tool": (
        make("undeclared tool", ("q", "r", "search"), ("x", "y", "drop_db"), domain="mcp", source="api", tools=TOOLS),
        False,
        {},
        "action_space",
    ),
    "static screen": (
        make(
            "static screen",
            ("click", "[1] page", None),
            ("hover", "[1]  page", None),
            ("type", "[1] form", None),
            domain="web",
            source="api",
        ),
        True,
        {1: "gui_no_change"},
        None,
    ),
}


def decisions(store: Store) -> list[tuple]:
    return sorted(
        store.execute("SELECT trajectory_id, turn_index, rule, reason, config_hash FROM filter_decisions").fetchall(),
        key=repr,
    )


def counts(store: Store) -> dict[str, int]:
    tables = ("trajectories", "turns", "filter_decisions", "filter_state")
    return {table: store.scalar(f"SELECT count(*) FROM {table}") for table in tables}


@pytest.fixture
def corpus(store: Store) -> dict[str, str]:
    ids = insert(store, *(t for t, *_ in CORPUS.values()))
    return dict(zip(CORPUS, ids))


def test_every_drop_is_recorded_with_its_reason_and_nothing_is_deleted(config, store, corpus):
    result = filter_stage.run(config, store)

    by_id = {trajectory_id: name for name, trajectory_id in corpus.items()}
    recorded = store.rows("SELECT trajectory_id, turn_index, rule, reason, config_hash FROM filter_decisions")
    turn_level = {
        (by_id[r["trajectory_id"]], r["turn_index"]): r["rule"] for r in recorded if r["turn_index"] is not None
    }
    trajectory_level = {by_id[r["trajectory_id"]]: r["rule"] for r in recorded if r["turn_index"] is None}
    assert turn_level == {(name, i): rule for name, (_, _, drops, _) in CORPUS.items() for i, rule in drops.items()}
    assert trajectory_level == {name: rule for name, (_, _, _, rule) in CORPUS.items() if rule}
    assert all(r["reason"] for r in recorded)
    assert {r["config_hash"] for r in recorded} == {config.section_hash("filter")}
    reasons = {by_id[r["trajectory_id"]]: r["reason"] for r in recorded if r["turn_index"] is None}
    assert reasons["empty then short"] == "1 turn after turn-level filtering (< 2)"

    assert counts(store)["trajectories"] == len(CORPUS)
    assert counts(store)["turns"] == sum(len(t.turns) for t, *_ in CORPUS.values())
    kept = {by_id[row[0]] for row in store.execute("SELECT trajectory_id FROM kept_trajectories").fetchall()}
    assert kept == {name for name, (_, keep, _, _) in CORPUS.items() if keep}
    kept_turns = {
        (by_id[a], b) for a, b in store.execute("SELECT trajectory_id, turn_index FROM kept_turns").fetchall()
    }
    assert kept_turns == {
        (name, i) for name, (t, keep, drops, _) in CORPUS.items() if keep for i in range(len(t.turns)) if i not in drops
    }
    state = dict(store.execute("SELECT trajectory_id, kept_turns FROM filter_state").fetchall())
    assert {by_id[i]: n for i, n in state.items()} == {
        name: (len(t.turns) - len(drops) if keep else 0) for name, (t, keep, drops, _) in CORPUS.items()
    }

    metrics = result.metrics
    assert (metrics["judged"], metrics["kept"], metrics["dropped"]) == (7, 3, 4)
    assert metrics["dropped_turns"] == 3
    assert metrics["by_rule"] == {
        "action_space": 1,
        "empty_action": 1,
        "environment_failure": 1,
        "gui_no_change": 1,
        "min_turns": 2,
        "retry_cycle": 1,
    }


def test_drops_by_rule_counts_each_turn_once(config, store, corpus):
    filter_stage.run(config, store)
    rows = filter_stage.drops_by_rule(store)
    table = {(r["rule"], r["source"], r["domain"]): (r["trajectories"], r["turns"]) for r in rows}
    assert table == {
        ("min_turns", "bench", "terminal"): (2, 2),  # "single" (1 turn) and "empty then short" (2 - 1 removed)
        ("environment_failure", "bench", "web"): (1, 2),
        ("retry_cycle", "bench", "terminal"): (1, 1),
        ("empty_action", "bench", "terminal"): (1, 1),
        ("action_space", "api", "mcp"): (1, 2),
        ("gui_no_change", "api", "web"): (1, 1),
    }
    dropped_turns = sum(turns for _, turns in table.values())
    assert dropped_turns == counts(store)["turns"] - store.scalar("SELECT count(*) FROM kept_turns")
    assert filter_stage.run(config, store).tables["filter-drops"] == filter_stage.drops_by_rule(store)


def test_a_rerun_adds_no_row(config, store, corpus):
    filter_stage.run(config, store)
    before, recorded = counts(store), decisions(store)
    again = filter_stage.run(config, store)
    assert again.metrics["judged"] == 0
    assert counts(store) == before
    assert decisions(store) == recorded


def test_new_trajectories_are_judged_incrementally(config, store, corpus):
    filter_stage.run(config, store)
    recorded = decisions(store)
    added = insert(store, make("late", ok(1), ("", "?", None), ok(2)), make("late single", ok(9)))
    result = filter_stage.run(config, store)
    assert result.metrics["judged"] == 2
    assert counts(store)["filter_state"] == len(CORPUS) + 2
    new_rows = [row for row in decisions(store) if row not in recorded]
    assert sorted((row[0], row[1], row[2]) for row in new_rows) == sorted(
        [(added[0], 1, "empty_action"), (added[1], None, "min_turns")], key=repr
    )


def test_a_changed_config_rejudges_everything_under_the_new_hash(config, store, corpus):
    filter_stage.run(config, store)
    stricter = config.model_copy(update={"filter": config.filter.model_copy(update={"min_turns": 3})})
    new_hash = stricter.section_hash("filter")
    assert new_hash != config.section_hash("filter")

    result = filter_stage.run(stricter, store)
    assert result.metrics["rejudged"] == len(CORPUS) == result.metrics["judged"]
    assert store.execute("SELECT DISTINCT config_hash FROM filter_state").fetchall() == [(new_hash,)]
    assert store.execute("SELECT DISTINCT config_hash FROM filter_decisions").fetchall() == [(new_hash,)]
    # "retry" keeps 3 turns, "static screen" keeps 2 turns: now too few.
    kept = {row[0] for row in store.execute("SELECT trajectory_id FROM kept_trajectories").fetchall()}
    assert kept == {corpus["clean"], corpus["retry"]}
    assert counts(store)["trajectories"] == len(CORPUS)


def _kill_after(monkeypatch, batches: int) -> None:
    """Let `batches` batch writes commit, then fail the next one half-way, after its decisions
    are inserted and before its states are (a duplicate state row breaks the key), as a process
    killed inside the transaction would."""
    real = filter_stage.insert_states
    calls = []

    def insert_then_die(tx, batch, config_hash):
        if len(calls) == batches:
            real(tx, batch, config_hash)
        calls.append(1)
        real(tx, batch, config_hash)

    monkeypatch.setattr(filter_stage, "insert_states", insert_then_die)


def test_a_killed_run_keeps_whole_batches_and_the_rerun_completes_without_duplicates(
    config, store, corpus, tmp_path, monkeypatch
):
    _kill_after(monkeypatch, batches=1)
    with pytest.raises(duckdb.ConstraintException):
        filter_stage.run(config, store, batch_trajectories=3)
    monkeypatch.undo()
    assert counts(store)["filter_state"] == 3
    judged = [row[0] for row in store.execute("SELECT trajectory_id FROM filter_state").fetchall()]
    decided = {row[0] for row in store.execute("SELECT trajectory_id FROM filter_decisions").fetchall()}
    assert decided <= set(judged)  # no decision without its state: both or neither

    result = filter_stage.run(config, store, batch_trajectories=3)
    assert result.metrics["judged"] == len(CORPUS) - 3
    assert store.scalar("SELECT count(*) - count(DISTINCT trajectory_id) FROM filter_state") == 0
    # The resumed run's line, which a later skip shows, gives the store's totals beside its own work.
    kept = store.scalar("SELECT count(*) FROM kept_trajectories")
    assert (result.metrics["judged_in_all"], result.metrics["kept_in_all"]) == (len(CORPUS), kept)
    assert result.summary.endswith(f"; in all {len(CORPUS)} judged, {kept} kept, {len(CORPUS) - kept} dropped")

    with Store(tmp_path / "uninterrupted.duckdb") as fresh:
        insert(fresh, *(t for t, *_ in CORPUS.values()))
        filter_stage.run(config, fresh)
        assert decisions(store) == decisions(fresh)


def test_a_config_change_killed_after_the_reset_leaves_no_stale_judgement(config, store, corpus, monkeypatch):
    filter_stage.run(config, store)
    stricter = config.model_copy(update={"filter": config.filter.model_copy(update={"min_turns": 3})})
    _kill_after(monkeypatch, batches=0)
    with pytest.raises(duckdb.ConstraintException):
        filter_stage.run(stricter, store)
    # The old judgements went in one transaction; none of the new ones had committed.
    assert counts(store)["filter_state"] == counts(store)["filter_decisions"] == 0
    monkeypatch.undo()
    filter_stage.run(stricter, store)
    assert store.execute("SELECT DISTINCT config_hash FROM filter_state").fetchall() == [
        (stricter.section_hash("filter"),)
    ]


def test_the_public_trajectories_filter(public_data, config: SimulacraConfig, store):
    from stages import ingest

    ingest.run(config, store, paths=[str(public_data / "tau_bench"), str(public_data / "react_alfworld")])
    result = filter_stage.run(config, store)
    assert result.metrics["judged"] == store.scalar("SELECT count(*) FROM trajectories") > 0
    # tau-bench declares its tools and calls only those: no action-space drop.
    assert "action_space" not in result.metrics["by_rule"]
    assert result.metrics["kept"] > 0.9 * result.metrics["judged"]
    # ReAct ALFWorld answers an invalid action with "Nothing happens.": the game's real answer, kept.
    nothing_happens = store.scalar("SELECT count(*) FROM kept_turns WHERE observation = 'Nothing happens.'")
    assert nothing_happens > 0
    assert store.scalar("SELECT count(*) FROM filter_decisions WHERE rule = 'retry_cycle'") == 0


def test_the_public_swe_agent_timeouts_drop_their_trajectories(public_data, config: SimulacraConfig, store):
    """Issue 8: SWE-agent answers a command it gave up on with `EXECUTION TIMED OUT`, a harness
    timeout (SPEC: environment failure). Three demonstrations show it: alone as the observation
    (rock.traj turn 0, katy.traj turn 16), and after 3,380 characters of output (BabyTimeCapsule.traj
    turn 7, beyond environment_failure's 2,000-character limit). All three were kept before
    `harness_timeout`; now they, and only they, are dropped by it."""
    from stages import ingest

    ingest.run(config, store, paths=[str(public_data / "swe_agent")])
    result = filter_stage.run(config, store)
    dropped = store.execute(
        """SELECT regexp_extract(t.location, '[^/]+$'), d.reason FROM filter_decisions d
           JOIN trajectories t USING (trajectory_id) WHERE d.rule = 'harness_timeout' ORDER BY 1"""
    ).fetchall()
    pattern = "observation matches harness timeout pattern `(?m)^EXECUTION TIMED OUT\\b`"
    assert dropped == [
        ("BabyTimeCapsule.traj", f"turn 7: {pattern}"),
        ("katy.traj", f"turn 16: {pattern}"),
        ("rock.traj", f"turn 0: {pattern}"),
    ]
    assert result.metrics["by_rule"] == {"harness_timeout": 3}
    assert result.metrics["kept"] == result.metrics["judged"] - 3


def test_the_batch_size_does_not_change_the_decisions(config, store, corpus, tmp_path):
    filter_stage.run(config, store, batch_trajectories=2)
    with Store(tmp_path / "one-batch.duckdb") as fresh:
        insert(fresh, *(t for t, *_ in CORPUS.values()))
        filter_stage.run(config, fresh)
        assert decisions(store) == decisions(fresh)


def test_a_hand_edited_store_is_judged_as_it_stands(config, store):
    """Turns stored out of order, turns missing behind num_turns' back, a trajectory with none:
    judged on the turns the store holds, under their stored indices."""
    shuffled, short, empty, gap = insert(
        store,
        make("shuffled", ok(1), ok(2), ok(3)),
        make("short", ok(1), ok(2)),
        make("empty", ok(1)),
        make("gap", ok(1), ok(2), ("  ", "$", None)),
    )
    with store.transaction() as con:
        con.execute("DELETE FROM turns WHERE trajectory_id = ? AND turn_index = 0", [shuffled])
        con.execute("INSERT INTO turns VALUES (?, 0, 'echo 1', '1', NULL, false, NULL)", [shuffled])
        con.execute("DELETE FROM turns WHERE trajectory_id = ? AND turn_index = 1", [short])
        con.execute("DELETE FROM turns WHERE trajectory_id = ?", [empty])
        con.execute("DELETE FROM turns WHERE trajectory_id = ? AND turn_index = 0", [gap])

    result = filter_stage.run(config, store)
    assert result.metrics["judged"] == 4
    assert result.metrics["turns"] == 3 + 1 + 0 + 2
    assert decisions(store) == sorted(
        [
            (short, None, "min_turns", "1 turn (< 2)", config.section_hash("filter")),
            (empty, None, "min_turns", "0 turns (< 2)", config.section_hash("filter")),
            (gap, 2, "empty_action", "empty action", config.section_hash("filter")),
            (gap, None, "min_turns", "1 turn after turn-level filtering (< 2)", config.section_hash("filter")),
        ],
        key=repr,
    )
    assert store.scalar("SELECT kept_turns FROM filter_state WHERE trajectory_id = ?", [shuffled]) == 3
