"""Closed-loop rollouts (issue 31, deliver 1): a simulator's own answers become its history, every step scored.

- A scripted simulator (answers from a table, every call recorded): the closed loop's history at step 2 holds
  the simulator's step-1 answer where the open loop's holds the real one; one simulator call per step, every
  trajectory and mode in it; a failed generation ends a closed loop and nothing else; the history is cut
  within `max_history_chars` by what it holds.
- Held-out trajectories from a real store's eval pool and from benchmark files: thought turns are never a step
  but stay in the history; a seeded choice (a larger budget a superset); AgentWorldBench's row-per-turn
  trajectory read once.
- Divergence and censoring on a table of cases; the Kaplan-Meier median; the aggregates on a hand-computed case.
- The real tiny model through the LLM client rolling out eval-pool trajectories of the demo, and a rerun that
  sends no request (the cache answers every step); the retrieval baseline as a simulator.
"""

import json
from pathlib import Path

import pytest

from pipeline.config import load_config
from pipeline.config.evaluate import EvaluateConfig
from pipeline.evaluation.intervals import Interval
from pipeline.evaluation.scoring import Prediction, Scorer
from pipeline.fidelity.curves import (
    DIVERGENCE_THRESHOLD,
    Divergence,
    fidelity_curves,
    fidelity_plot,
    fidelity_table,
    first_divergence,
    kaplan_meier_median,
    median_divergences,
)
from pipeline.fidelity.rollouts import CLOSED_LOOP, OPEN_LOOP, Rollouts, ScoredStep, roll_out
from pipeline.fidelity.simulators import SimulatorRequest
from pipeline.fidelity.trajectories import benchmark_trajectories, cut, pool_trajectories
from pipeline.store.database import Store
from pipeline.store.schema import ScoredTurn, SystemPrompt
from pipeline.store.snapshot import export_snapshot
from stages import filter as filter_stage
from stages import ingest, split
from tests.test_benchmark_reader import MARKER, SYSTEM, awb_row

REPO = Path(__file__).resolve().parents[1]


def _turns(*pairs: tuple[str, str]) -> list[ScoredTurn]:
    return [ScoredTurn(i, action, observation, "", 1.0) for i, (action, observation) in enumerate(pairs)]


# Three trajectories of 3, 2 and 1 environment steps; the first thinks aloud before its second step.
LISTING = _turns(("ls", "a.txt\nb.txt"), ("think: read a", "OK."), ("cat a.txt", "hello"), ("wc -l a.txt", "1 a.txt"))
TRAJECTORIES = [
    cut("t-ls", "terminal", SystemPrompt("list files"), LISTING, {1}, None),
    cut("t-mk", "terminal", SystemPrompt("make a folder"), _turns(("mkdir x", ""), ("ls", "x")), set(), None),
    cut("t-go", "text-game", SystemPrompt("go north"), _turns(("go north", "You are in a hall.")), set(), None),
]


class ScriptedSimulator:
    """Answers from a table, (trajectory, turn index) -> observation (None: the generation fails); records
    every call it receives."""

    name = "scripted"

    def __init__(self, answers: dict[tuple[str, int], str | None]):
        self.answers = answers
        self.calls: list[list[SimulatorRequest]] = []

    def observations(self, requests):
        self.calls.append(list(requests))
        predictions = []
        for request in requests:
            text = self.answers[(request.trajectory_id, request.turn_index)]
            failed = Prediction("generation_failed", None, None, "HTTP 500: down")
            predictions.append(failed if text is None else Prediction("ok", text, None, None))
        return predictions


ANSWERS = {
    ("t-ls", 0): "a.txt",  # b.txt forgotten: the closed loop carries that on
    ("t-ls", 2): "hello",
    ("t-ls", 3): "1 a.txt",
    ("t-mk", 0): "",
    ("t-mk", 1): "x",
    ("t-go", 0): "You are in a hall.",
}


@pytest.fixture(scope="module")
def scorer() -> Scorer:
    return Scorer(EvaluateConfig(), None)  # evaluation's default: the offline similarity judge


def _by(rollouts: Rollouts, mode: str, trajectory_id: str) -> list[ScoredStep]:
    return [s for s in rollouts.steps if s.mode == mode and s.trajectory_id == trajectory_id]


def test_the_closed_loop_feeds_the_simulator_its_own_answers_and_the_open_loop_the_real_ones(scorer):
    simulator = ScriptedSimulator(ANSWERS)
    rollouts = roll_out(TRAJECTORIES, simulator, scorer, max_history_chars=None)

    step_two = [r for r in simulator.calls[1] if r.trajectory_id == "t-ls"]
    opened, closed = step_two  # a call holds the open loop's requests, then the closed loop's
    assert [(t.action, t.observation) for t in opened.history] == [("ls", "a.txt\nb.txt"), ("think: read a", "OK.")]
    # The simulator's own step-1 answer; the thought keeps the harness's real answer in both.
    assert [(t.action, t.observation) for t in closed.history] == [("ls", "a.txt"), ("think: read a", "OK.")]
    assert opened.action == closed.action == "cat a.txt" and opened.own_system_prompt is None
    step_three = [r for r in simulator.calls[2] if r.trajectory_id == "t-ls"]
    assert [t.observation for t in step_three[1].history] == ["a.txt", "OK.", "hello"]

    # Step 1 is the same request in both modes: the same answer, the same score.
    first = {mode: _by(rollouts, mode, "t-ls")[0] for mode in (OPEN_LOOP, CLOSED_LOOP)}
    assert first[OPEN_LOOP].score == first[CLOSED_LOOP].score < 100.0
    assert [s.score for s in _by(rollouts, CLOSED_LOOP, "t-go")] == [100.0]  # the real observation, word for word
    assert [s.turn_index for s in _by(rollouts, CLOSED_LOOP, "t-ls")] == [0, 2, 3]  # the thought is no step


def test_each_step_is_one_simulator_call_holding_every_trajectory_that_has_it_in_both_modes(scorer):
    simulator = ScriptedSimulator(ANSWERS)
    rollouts = roll_out(TRAJECTORIES, simulator, scorer, max_history_chars=None)
    asked = [[(r.trajectory_id, r.turn_index) for r in call] for call in simulator.calls]
    assert asked == [
        [("t-ls", 0), ("t-mk", 0), ("t-go", 0)] * 2,
        [("t-ls", 2), ("t-mk", 1)] * 2,
        [("t-ls", 3)] * 2,
    ]
    assert len(rollouts.steps) == 12 and rollouts.simulator == "scripted" and rollouts.judge == scorer.name
    assert roll_out(TRAJECTORIES, ScriptedSimulator(ANSWERS), scorer, None, modes=[CLOSED_LOOP]).steps == tuple(
        s for s in rollouts.steps if s.mode == CLOSED_LOOP
    )


def test_a_failed_generation_ends_its_closed_loop_and_nothing_else(scorer):
    simulator = ScriptedSimulator({**ANSWERS, ("t-ls", 0): None})
    rollouts = roll_out(TRAJECTORIES, simulator, scorer, max_history_chars=None)
    failed = _by(rollouts, CLOSED_LOOP, "t-ls")
    assert [(s.step, s.parse_status, s.score, s.error) for s in failed] == [
        (1, "generation_failed", None, "HTTP 500: down")
    ]
    assert [s.step for s in _by(rollouts, OPEN_LOOP, "t-ls")] == [1, 2, 3]  # the open loop needs no answer of its own
    assert [s.step for s in _by(rollouts, CLOSED_LOOP, "t-mk")] == [1, 2]
    assert [(r.trajectory_id, r.turn_index) for r in simulator.calls[2]] == [("t-ls", 3)]


def test_a_resumed_rollout_asks_only_the_steps_not_stored_and_feeds_back_the_stored_answers(scorer):
    """Steps 1 and 2 were stored by a run that died; the rerun asks step 3 alone, with the stored step-2 answer of
    the closed loop in its history, and a stored failed generation is asked again."""
    recorded: list[list[ScoredStep]] = []
    whole = roll_out(
        TRAJECTORIES, ScriptedSimulator(ANSWERS), scorer, None, record=lambda steps: recorded.append(list(steps))
    )
    assert [len(steps) for steps in recorded] == [6, 4, 2] and sum(recorded, []) == sorted(
        whole.steps, key=lambda s: s.step
    )
    stored = {(s.trajectory_id, s.mode, s.step): s for s in recorded[0] + recorded[1]}
    failed = ("t-mk", CLOSED_LOOP, 2)
    stored[failed] = ScoredStep(
        "t-mk", "terminal", CLOSED_LOOP, 2, 1, 0, None, "generation_failed", None, None, None, "x"
    )
    simulator, again = ScriptedSimulator(ANSWERS), []
    resumed = roll_out(TRAJECTORIES, simulator, scorer, None, done=stored, record=again.append)
    assert [[(r.trajectory_id, r.turn_index) for r in call] for call in simulator.calls] == [
        [("t-mk", 1)],
        [("t-ls", 3), ("t-ls", 3)],
    ]
    assert [t.observation for t in simulator.calls[1][1].history] == ["a.txt", "OK.", "hello"]  # stored answers
    assert resumed == whole and [len(steps) for steps in again] == [1, 2]


def test_the_history_is_cut_within_max_history_chars_by_what_it_holds(scorer):
    # At step 2 the real history is `ls` + 11 characters (13) and the thought (16): 29 > 20, the oldest turn
    # left out. The closed loop's `ls` answered `a` (3 characters): 19, both kept.
    simulator = ScriptedSimulator({**ANSWERS, ("t-ls", 0): "a"})
    rollouts = roll_out(TRAJECTORIES[:1], simulator, scorer, max_history_chars=20)
    opened, closed = simulator.calls[1]
    assert [t.action for t in opened.history] == ["think: read a"] and _by(rollouts, OPEN_LOOP, "t-ls")[
        1
    ].history_left_out == 1
    assert [t.action for t in closed.history] == ["ls", "think: read a"]
    assert _by(rollouts, CLOSED_LOOP, "t-ls")[1].history_left_out == 0


def test_exact_match_masks_runtime_metadata(scorer):
    trajectory = cut("t-ps", "terminal", SystemPrompt("run"), _turns(("sleep 9 &", "[1] 4242")), set(), None)
    rollouts = roll_out([trajectory], ScriptedSimulator({("t-ps", 0): "[1] 977"}), scorer, None, modes=[OPEN_LOOP])
    assert [s.exact_match for s in rollouts.steps] == [True]  # another PID: the same class of content


# -- held-out trajectories ------------------------------------------------------------------------
GAME = """You are in a kitchen. You see a fridge 1 and a table 1.
Your task is to: put an apple on table 1.
> go to fridge 1
The fridge 1 is closed.
> think: the apple must be in the fridge
OK.
> open fridge 1
You open the fridge 1. In it, you see an apple 1.
> take apple 1 from fridge 1
You pick up the apple 1 from the fridge 1.
> go to table 1
On the table 1, you see nothing.
"""


def _games(folder: Path, count: int) -> Path:
    folder.mkdir()
    for n in range(count):
        (folder / f"game-{n}.txt").write_text(GAME.replace("table 1", f"table {n + 1}"))
    return folder


def test_the_eval_pool_gives_a_seeded_choice_of_trajectories_cut_after_their_environment_steps(tmp_path):
    config = load_config(
        None,
        [
            {
                "workspace": {"path": str(tmp_path / "workspace")},
                "split": {"ratios": {"cpt": 0, "sft": 0, "rl": 0, "val": 0, "eval": 1}},
            }
        ],
    )
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store, paths=[str(_games(tmp_path / "games", 4))])
        filter_stage.run(config, store)
        split.run(config, store)
        snapshot = export_snapshot(store, tmp_path / "snapshot", ("eval",))
        two = pool_trajectories(store, snapshot, limit=2, seed=7, max_steps=2)
        three = pool_trajectories(store, snapshot, limit=3, seed=7, max_steps=2)
        again = pool_trajectories(store, snapshot, limit=2, seed=7, max_steps=2)
        whole = pool_trajectories(store, snapshot, limit=None, seed=7, max_steps=None)

    assert two == again and two.trajectories == three.trajectories[:2]  # a larger budget: a superset
    assert two.counts == {"trajectories_read": 4, "trajectories": 2, "steps": 4}
    held_out = two.trajectories[0]
    # The thought (turn 1) stays in the history and is no step; the cut is after the 2nd environment turn.
    assert [t.action for t in held_out.turns] == [
        "go to fridge 1",
        "think: the apple must be in the fridge",
        "open fridge 1",
    ]
    assert held_out.steps == (0, 2) and held_out.environment_turns == 4 and held_out.domain == "text-game"
    assert {t.steps for t in whole.trajectories} == {(0, 2, 3, 4)} and len(whole.trajectories) == 4


def test_benchmark_files_give_the_same_trajectories_and_a_row_per_turn_is_read_once(tmp_path):
    rows = [awb_row(1), awb_row(3), awb_row(2), awb_row(3)]
    (tmp_path / "terminal_test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    _games(tmp_path / "games", 1)
    read = benchmark_trajectories([str(tmp_path / "terminal_test.jsonl"), str(tmp_path / "games")], None, 0, 2)

    assert read.counts["trajectories_read"] == 5 and read.counts["repeated"] == 3 and read.counts["trajectories"] == 2
    by_domain = {t.domain: t for t in read.trajectories}
    terminal = by_domain["terminal"]
    assert terminal.own_system_prompt == SYSTEM and terminal.response_marker == MARKER
    assert terminal.steps == (0, 1) and terminal.environment_turns == 3  # the longest row, cut at 2 steps
    assert by_domain["text-game"].steps == (0, 2)  # its thought is no step here either


# -- divergence and aggregates --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([80.0, 70.0, 40.0, 90.0], (3, True)),  # the first step below 50; what follows does not matter
        ([30.0], (1, True)),
        ([80.0, 90.0], (2, False)),  # never diverged: censored at its length
        ([DIVERGENCE_THRESHOLD], (1, False)),  # at the threshold is not below it
        ([80.0, None, 10.0], (1, False)),  # an unscored step ends what is known: censored before it
        ([None], (0, False)),
        ([], (0, False)),
    ],
)
def test_steps_to_first_divergence(scores, expected):
    assert first_divergence(scores) == expected


@pytest.mark.parametrize(
    ("followed", "median"),
    [
        # At step 2: 3 at risk (the one censored at 1 no longer), 1 diverges: 2/3 left. Step 3: 2 at risk, 1
        # diverges: 1/3 <= 1/2. (Counting the censored as diverged at their length would give 2.5.)
        ([(2, True), (1, False), (3, True), (5, False)], 3),
        ([(3, False), (2, True), (4, False)], None),  # 2/3 never drop to a half: not reached
        ([(1, True), (1, True), (2, False)], 1),
        ([(2, True), (2, False)], 2),  # censored at 2 was at risk at 2: 1/2 left
        ([], None),
    ],
)
def test_the_kaplan_meier_median_counts_a_censored_trajectory_as_followed_and_no_further(followed, median):
    assert kaplan_meier_median(followed) == median


def _step(trajectory_id: str, domain: str, mode: str, step: int, score: float, exact: bool = False) -> ScoredStep:
    return ScoredStep(trajectory_id, domain, mode, step, step - 1, 0, "x", "ok", score, score / 100, exact, None)


# Terminal: a and b score 80 and 60 at step 1 in both modes; at step 2 the open loop holds, the closed loop
# drops by 40 each. The text game's c, one step, scores 100.
HAND = Rollouts(
    "hand",
    "semantic",
    tuple(
        [_step("a", "terminal", mode, 1, 80.0, exact=True) for mode in (OPEN_LOOP, CLOSED_LOOP)]
        + [_step("b", "terminal", mode, 1, 60.0) for mode in (OPEN_LOOP, CLOSED_LOOP)]
        + [_step("c", "text-game", mode, 1, 100.0, exact=True) for mode in (OPEN_LOOP, CLOSED_LOOP)]
        + [_step("a", "terminal", OPEN_LOOP, 2, 80.0), _step("b", "terminal", OPEN_LOOP, 2, 60.0)]
        + [_step("a", "terminal", CLOSED_LOOP, 2, 40.0), _step("b", "terminal", CLOSED_LOOP, 2, 20.0)]
    ),
)


def test_the_aggregates_on_a_hand_computed_case(tmp_path):
    curves = fidelity_curves(HAND)
    points = {(p.domain, p.mode, p.step): p for p in curves.points}
    assert points[("terminal", OPEN_LOOP, 1)].score.mean == 70.0 and points[("terminal", OPEN_LOOP, 1)].score.n == 2
    assert (
        60.0
        <= points[("terminal", OPEN_LOOP, 1)].score.low
        < 70.0
        < points[("terminal", OPEN_LOOP, 1)].score.high
        <= 80.0
    )
    assert points[("terminal", CLOSED_LOOP, 2)].score.mean == 30.0
    assert points[("terminal", OPEN_LOOP, 1)].exact_match.mean == 0.5
    assert points[("all", OPEN_LOOP, 1)].score.mean == 80.0 and points[("all", OPEN_LOOP, 1)].score.n == 3
    assert points[("text-game", CLOSED_LOOP, 1)].score == Interval(100.0, 100.0, 100.0, 1)
    assert ("text-game", OPEN_LOOP, 2) not in points
    gaps = {(g.domain, g.step): g.gap for g in curves.gaps}
    # Paired by trajectory: -40 for each, so the interval has no width; step 1 is the same request in both.
    assert gaps[("terminal", 2)] == Interval(-40.0, -40.0, -40.0, 2) and gaps[("terminal", 1)].mean == 0.0
    assert gaps[("all", 2)] == Interval(-40.0, -40.0, -40.0, 2)

    divergences = {(d.trajectory_id, d.mode): (d.steps, d.diverged) for d in curves.divergences}
    assert divergences == {
        ("a", OPEN_LOOP): (2, False),
        ("b", OPEN_LOOP): (2, False),
        ("c", OPEN_LOOP): (1, False),
        ("a", CLOSED_LOOP): (2, True),
        ("b", CLOSED_LOOP): (2, True),
        ("c", CLOSED_LOOP): (1, False),
    }
    medians = {(m.domain, m.mode): m for m in curves.medians}
    assert medians[("terminal", CLOSED_LOOP)].median == 2 and medians[("terminal", OPEN_LOOP)].median is None
    assert medians[("all", CLOSED_LOOP)].median == 2 and medians[("all", CLOSED_LOOP)].diverged == 2
    assert medians[("terminal", OPEN_LOOP)].text() == "more than 2 (0 of 2 diverged)"

    table = fidelity_table(curves)
    assert "-40.0 [-40.0, -40.0]" in table and "closed loop (Kaplan-Meier median): 2 (2 of 2 diverged)" in table
    assert table.index("\nterminal\n") < table.index("\ntext-game\n") < table.index("\nall\n")
    plot = fidelity_plot(curves, tmp_path / "fidelity.png")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_median_divergences_are_per_domain_and_mode():
    found = [Divergence("a", "terminal", CLOSED_LOOP, 1, True), Divergence("b", "text-game", CLOSED_LOOP, 3, False)]
    medians = [(m.domain, m.mode, m.median, m.longest) for m in median_divergences(found)]
    assert medians == [
        ("terminal", CLOSED_LOOP, 1, 1),
        ("text-game", CLOSED_LOOP, None, 3),
        ("all", CLOSED_LOOP, 1, 3),  # 1 of 2 diverged at step 1: the share left is a half, the median
    ]


# -- the real tiny model and the retrieval baseline -----------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, Path]:
    """The demo's terminal trajectories split into pools, and a snapshot of the cpt and eval pools."""
    root = tmp_path_factory.mktemp("closed-loop-demo")
    config = load_config(None, [{"workspace": {"path": str(root / "workspace")}}])
    with Store(config.workspace.database_path) as store:
        ingest.run(config, store, paths=[str(REPO / "data/demo/terminal.jsonl")])
        filter_stage.run(config, store)
        split.run(config, store)
        export_snapshot(store, root / "snapshot", ("cpt", "eval"))
    return config.workspace.database_path, root / "snapshot"


def test_the_tiny_model_rolls_out_demo_trajectories_and_a_rerun_asks_nothing(demo, tiny_chat_model, scorer):
    from pipeline.config.llm import EndpointConfig
    from pipeline.evaluation.prompting import NON_THINKING
    from pipeline.fidelity.simulators import ChatSimulator
    from pipeline.llm.client import open_client

    database, snapshot = demo
    endpoint = EndpointConfig(
        backend="transformers", model=str(tiny_chat_model), temperature=0.0, max_tokens=12, batch_size=8
    )
    with Store(database) as store:
        held_out = pool_trajectories(store, snapshot, limit=3, seed=0, max_steps=3)
        runs = []
        for _ in range(2):
            simulator = ChatSimulator("tiny", open_client(endpoint, store, "fidelity.tiny"), NON_THINKING)
            runs.append(
                (roll_out(held_out.trajectories, simulator, scorer, max_history_chars=1500), simulator.client.tally)
            )

    (first, asked), (rerun, answered) = runs
    steps = sum(len(t.steps) for t in held_out.trajectories)
    assert len(held_out.trajectories) == 3 and len(first.steps) == 2 * steps
    assert all(s.score is not None and 0.0 <= s.score <= 100.0 for s in first.steps)
    # Step 1 is one request for both modes (asked once); every later step is asked in each.
    assert asked.requests == 2 * steps - len(held_out.trajectories) and asked.done == asked.requests
    assert asked.failed == 0
    # The rerun builds the same requests from the cached answers, step after step, and sends none.
    assert answered.done == 0 and answered.cached == answered.requests == asked.requests
    assert rerun == first


def test_the_retrieval_baseline_is_a_simulator(demo, scorer):
    from pipeline.fidelity.simulators import RetrievalSimulator

    database, snapshot = demo
    with Store(database) as store:
        held_out = pool_trajectories(store, snapshot, limit=2, seed=0, max_steps=3)
    simulator = RetrievalSimulator(snapshot, history_turns=2)
    rollouts = roll_out(held_out.trajectories, simulator, scorer, max_history_chars=1500)
    known = {turn.observation for turn in simulator.index.turns}
    assert rollouts.simulator == "retrieval baseline" and all(s.prediction in known for s in rollouts.steps)
    first = {(s.trajectory_id, s.mode): s.prediction for s in rollouts.steps if s.step == 1}
    assert all(first[(t, OPEN_LOOP)] == first[(t, CLOSED_LOOP)] for t, _ in first)


def _served(request: dict) -> str:
    """The judge's verdict (criteria 5/3/4/4/4: a mean of 4, 75 of 100), or the served world model's answer:
    `hello` to every action."""
    if request["model"] == "judge-model":
        criteria = {"format": 5, "factuality": 3, "consistency": 4, "realism": 4, "quality": 4}
        return json.dumps({"content_classes": ["deterministic output"], **criteria, "rationale": "scripted"})
    return "hello"


def test_a_served_world_model_judged_by_an_llm_judge_over_http(store):
    from pipeline.config.llm import EndpointConfig
    from pipeline.evaluation.prompting import DIRECT
    from pipeline.fidelity.simulators import ChatSimulator
    from pipeline.llm.client import open_client
    from tests.openai_server import OpenAIServer

    with OpenAIServer(answer=_served) as server:
        endpoint = {"backend": "openai", "base_url": server.base_url, "max_retries": 0, "timeout_s": 30}
        judge = Scorer(
            EvaluateConfig(judge={"kind": "llm", "endpoint": {**endpoint, "model": "judge-model", "temperature": 0.0}}),
            store,
        )
        served = open_client(EndpointConfig(**endpoint, model="world-model", temperature=0.0), store, "fidelity.served")
        rollouts = roll_out(TRAJECTORIES, ChatSimulator("served", served, DIRECT), judge, max_history_chars=None)
        asked = [e.body for e in server.log]

    assert rollouts.judge == judge.name and judge.name.startswith("llm:openai:judge-model prompt:rubric@")
    assert {s.score for s in rollouts.steps} == {75.0}
    # The closed loop's step 2 was asked with the served model's own step-1 answer as the observation.
    histories = [
        b["messages"][1:-1]
        for b in asked
        if b["model"] == "world-model" and b["messages"][-1]["content"] == "cat a.txt"
    ]
    assert sorted(h[1]["content"] for h in histories) == ["a.txt\nb.txt", "hello"]
    # Step 1 once for both modes, 2 and 3 once in each: 3 + 2 x 2 + 2 x 1 world-model requests.
    assert sum(b["model"] == "world-model" for b in asked) == 9
