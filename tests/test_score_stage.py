"""The score stage on a real DuckDB file: one score per kept turn, reruns, config changes, drops, reports."""

import pytest

from pipeline.config import SimulacraConfig, load_config
from pipeline.informativeness import SCORER_VERSION, score_frame, score_turn
from pipeline.store.database import Store
from stages import score as score_stage

# name -> (domain, source, turns). Each turn's category under the default table is in the comment.
CORPUS = {
    "terminal": (
        "terminal",
        "bench",
        [
            ("ls", "notes.txt  report.pdf  src  tests  README.md  setup.py"),  # retrieval
            ("mkdir build", ""),  # other: no observation words
            ("echo hello brave new world", "hello brave new world"),  # echo
        ],
    ),
    "alfworld": (
        "text-game",
        "react",
        [
            ("go to cabinet 1", "On the cabinet 1, you see a cloth 1, a soapbar 1, a soapbottle 1."),  # expansion
            ("put spraybottle 2 in/on toilet 1", "You put the spraybottle 2 in/on the toilet 1."),  # echo
        ],
    ),
}


def add_trajectory(store: Store, trajectory_id: str, domain: str, source: str, turns: list[tuple[str, str]]) -> None:
    """Rows as ingest and filter write them: the trajectory, its turns, and a kept filter_state."""
    with store.transaction() as con:
        con.execute(
            "INSERT INTO trajectories (trajectory_id, source, format, domain, task_description, num_turns, location, "
            "ingested_at) VALUES (?, ?, 'simulacra-jsonl', ?, 'simulate', ?, 'test', now())",
            [trajectory_id, source, domain, len(turns)],
        )
        con.executemany(
            "INSERT INTO turns VALUES (?, ?, ?, ?, NULL, false, NULL)",
            [[trajectory_id, i, action, observation] for i, (action, observation) in enumerate(turns)],
        )
        con.execute("INSERT INTO filter_state VALUES (?, 'filter-v1', true, ?)", [trajectory_id, len(turns)])


@pytest.fixture
def corpus(store: Store) -> Store:
    for name, (domain, source, turns) in CORPUS.items():
        add_trajectory(store, name, domain, source, turns)
    return store


def scores(store: Store) -> list[dict]:
    return store.rows("SELECT * EXCLUDE (config_hash) FROM turn_scores ORDER BY trajectory_id, turn_index")


def test_every_kept_turn_scored_once_as_the_reference_says(config: SimulacraConfig, corpus: Store) -> None:
    result = score_stage.run(config, corpus)
    rows = scores(corpus)
    assert len(rows) == 5 and result.metrics["turns_scored"] == 5
    expected = {"terminal": ["retrieval", "other", "echo"], "alfworld": ["expansion", "echo"]}
    for row in rows:
        action, observation = CORPUS[row["trajectory_id"]][2][row["turn_index"]]
        reference = score_turn(action, observation, config.score)
        assert row["category"] == reference.category == expected[row["trajectory_id"]][row["turn_index"]]
        assert row["keep_ratio"] == reference.keep_ratio
        assert row["overlap"] == reference.metrics.overlap and row["novelty"] == reference.metrics.novelty
        assert row["scorer_version"] == SCORER_VERSION
    assert corpus.scalar("SELECT count(DISTINCT config_hash) FROM turn_scores") == 1
    assert corpus.scalar("SELECT any_value(config_hash) FROM turn_scores") == config.section_hash("score")
    assert result.metrics["category_echo"] == 2 and "echo 40.0%" in result.summary
    assert result.images["categories"].read_bytes().startswith(b"\x89PNG")  # the UI's category plot


def test_rerun_computes_nothing_and_new_turns_alone_are_scored(config: SimulacraConfig, corpus: Store) -> None:
    score_stage.run(config, corpus)
    before = scores(corpus)
    again = score_stage.run(config, corpus)
    assert again.metrics["turns_scored"] == 0 and again.metrics["scores_replaced"] == 0
    assert scores(corpus) == before
    add_trajectory(corpus, "new", "mcp", "tau", [("get_user(42)", '{"user_id": 42, "name": "Mia"}')])
    added = score_stage.run(config, corpus)
    assert added.metrics["turns_scored"] == 1 and added.metrics["turns_with_score"] == 6
    assert [r for r in scores(corpus) if r["trajectory_id"] != "new"] == before


def test_changed_table_replaces_every_score(config: SimulacraConfig, corpus: Store, tmp_path) -> None:
    score_stage.run(config, corpus)
    changed = load_config(
        None, [{"workspace": {"path": str(tmp_path / "workspace")}, "score": {"keep_ratios": {"echo": 0.2}}}]
    )
    result = score_stage.run(changed, corpus)
    assert result.metrics["scores_replaced"] == 5 and result.metrics["turns_scored"] == 5
    assert corpus.scalar("SELECT count(DISTINCT config_hash) FROM turn_scores") == 1
    assert corpus.scalar("SELECT any_value(config_hash) FROM turn_scores") == changed.section_hash("score")
    assert {r["keep_ratio"] for r in scores(corpus) if r["category"] == "echo"} == {0.2}


def test_chunks_give_the_scores_one_chunk_gives(config: SimulacraConfig, corpus: Store, monkeypatch) -> None:
    score_stage.run(config, corpus)
    whole = scores(corpus)
    with corpus.transaction() as con:
        con.execute("DELETE FROM turn_scores")
    monkeypatch.setattr(score_stage, "CHUNK_TURNS", 2)
    chunks = []

    def counted(turns, c):
        chunks.append(len(turns))
        return score_frame(turns, c)

    monkeypatch.setattr(score_stage, "score_frame", counted)
    assert score_stage.run(config, corpus).metrics["turns_scored"] == 5
    assert sorted(chunks) == [1, 2, 2] and scores(corpus) == whole


def test_a_failed_rescore_leaves_the_old_scores(config: SimulacraConfig, corpus: Store, tmp_path, monkeypatch) -> None:
    score_stage.run(config, corpus)
    before = corpus.rows("SELECT * FROM turn_scores ORDER BY trajectory_id, turn_index")
    changed = load_config(
        None, [{"workspace": {"path": str(tmp_path / "workspace")}, "score": {"short_observation_chars": 10}}]
    )
    # Killed on the second chunk, when the transaction has deleted the old scores and inserted the first chunk's.
    monkeypatch.setattr(score_stage, "CHUNK_TURNS", 2)
    calls = []

    def killed_on_the_second_chunk(turns, c):
        calls.append(len(turns))
        if len(calls) == 2:
            inside = corpus.rows("SELECT config_hash FROM turn_scores")
            assert inside == [{"config_hash": changed.section_hash("score")}] * 2
            raise RuntimeError("killed")
        return score_frame(turns, c)

    monkeypatch.setattr(score_stage, "score_frame", killed_on_the_second_chunk)
    with pytest.raises(RuntimeError, match="killed"):
        score_stage.run(changed, corpus)
    assert len(calls) == 2
    assert corpus.rows("SELECT * FROM turn_scores ORDER BY trajectory_id, turn_index") == before
    monkeypatch.undo()
    assert score_stage.run(changed, corpus).metrics["scores_replaced"] == 5


def test_turns_the_filter_dropped_lose_their_scores(config: SimulacraConfig, corpus: Store) -> None:
    score_stage.run(config, corpus)
    with corpus.transaction() as con:
        con.execute("UPDATE filter_state SET kept = false WHERE trajectory_id = 'alfworld'")
        con.execute(
            "INSERT INTO filter_decisions VALUES ('terminal', 1, 'empty_observation', 'test', 'filter-v2', now())"
        )
    result = score_stage.run(config, corpus)
    assert result.metrics["scores_of_dropped_turns_removed"] == 3 and result.metrics["turns_scored"] == 0
    assert [(r["trajectory_id"], r["turn_index"]) for r in scores(corpus)] == [("terminal", 0), ("terminal", 2)]


def test_a_repeat_is_judged_against_the_kept_turn_before_it(config: SimulacraConfig, store: Store, tmp_path) -> None:
    """`previous_observation` is the kept turn's before it: a turn the filter dropped between two equal
    observations is not in the context, so the second is a repeat; a first turn is none, and a turn
    scored alone on a rerun still sees the one before it."""
    silent = [("mkdir a", ""), ("ls -1 log", "ls: cannot access 'log'"), ("mkdir b", ""), ("mkdir c", "")]
    add_trajectory(store, "shell", "terminal", "bench", silent)
    with store.transaction() as con:
        con.execute("INSERT INTO filter_decisions VALUES ('shell', 1, 'retry_cycle', 'test', 'filter-v2', now())")
    masked = load_config(
        None, [{"workspace": {"path": str(tmp_path / "workspace")}, "score": {"keep_ratios": {"repeat": 0.0}}}]
    )
    result = score_stage.run(masked, store)
    assert [(r["turn_index"], r["category"], r["keep_ratio"]) for r in scores(store)] == [
        (0, "other", 1.0),
        (2, "repeat", 0.0),
        (3, "repeat", 0.0),
    ]
    assert result.metrics["category_repeat"] == 2 and "repeat 66.7%" in result.summary
    with store.transaction() as con:
        con.execute("DELETE FROM turn_scores WHERE turn_index = 3")
    assert score_stage.run(masked, store).metrics["turns_scored"] == 1
    assert scores(store)[-1]["category"] == "repeat"
    # The dropped turn restored: turn 2 follows an error now, so its repeat goes, and only its score is redone.
    with store.transaction() as con:
        con.execute("DELETE FROM filter_decisions WHERE trajectory_id = 'shell'")
    again = score_stage.run(masked, store)
    assert again.metrics["scores_of_changed_repeats_removed"] == 1 and again.metrics["turns_scored"] == 2
    assert [(r["turn_index"], r["category"]) for r in scores(store)] == [
        (0, "other"),
        (1, "expansion"),
        (2, "other"),
        (3, "repeat"),
    ]


def test_category_report_per_domain_and_source(config: SimulacraConfig, corpus: Store) -> None:
    score_stage.run(config, corpus)
    report = score_stage.category_report(corpus)
    by_key = {(r["domain"], r["category"]): r for r in report}
    terminal_all = by_key[("terminal", "all")]
    assert terminal_all["source"] == "bench" and terminal_all["turns"] == 3 and terminal_all["turn_share"] == 1.0
    echo, retrieval = by_key[("terminal", "echo")], by_key[("terminal", "retrieval")]
    assert echo["turns"] == 1 and echo["turn_share"] == pytest.approx(1 / 3)
    chars = {"echo": len("hello brave new world"), "retrieval": len(CORPUS["terminal"][2][0][1]), "other": 0}
    assert terminal_all["observation_chars"] == sum(chars.values())
    assert echo["char_share"] == pytest.approx(chars["echo"] / sum(chars.values()))
    assert retrieval["mean_keep_ratio"] == 1.0 and echo["mean_keep_ratio"] == 0.05
    assert terminal_all["mean_keep_ratio"] == pytest.approx((1.0 + 1.0 + 0.05) / 3)
    assert terminal_all["kept_char_share"] == pytest.approx(
        (chars["retrieval"] + 0.05 * chars["echo"]) / sum(chars.values())
    )
    for domain in ("terminal", "text-game"):
        parts = [r for r in report if r["domain"] == domain and r["category"] != "all"]
        assert sum(r["turn_share"] for r in parts) == pytest.approx(1.0)
        assert sum(r["char_share"] for r in parts) == pytest.approx(1.0)
    assert score_stage.run(config, corpus).tables["categories"] == report
