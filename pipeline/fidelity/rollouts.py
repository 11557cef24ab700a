"""Rollouts: held-out trajectories replayed through a simulator, open loop and closed loop, every step scored.

Both modes replay the real actions, and score each step's prediction against the real observation:
- open loop: step t's history is the real earlier turns, as evaluation asks every target;
- closed loop: step t's history is the real earlier actions with the simulator's own earlier predictions as
  their observations, as an agent in the simulator experiences it. Its errors become its context.
The gap between the two at step t is what compounding costs there. Step 1 has no earlier prediction: its
request is the same in both modes (asked once, the client's identical requests being one), so the two curves
start together by construction.

Steps are synchronous across trajectories: at step t, every trajectory with a t-th environment step is asked,
in both modes, in ONE call to the simulator, so a local model decodes them together. The history is shortened
as training shortened it (pipeline/sft/queries.py `kept_history` within `max_history_chars`; None: all of
it); a thought turn keeps its real observation in both modes (the harness answers it, not the environment).

In the closed loop, what a prediction feeds back is what evaluation scores: the observation an answer yields,
the empty one where it yields none (a thinking answer with no closed `<think>` block). A generation that failed
after its retries is the endpoint's failure, not the model's: it has no score, and the trajectory's closed loop
stops there (nothing to feed back); the client does not cache a failure, so a rerun asks it again and goes on.

Resumable (`done`, `record`): a step already scored in an earlier run (keyed by trajectory, mode and step) is
neither asked nor scored again; its stored prediction is what the closed loop feeds back, so the later steps are
asked exactly as an uninterrupted run asks them. Each step's new scores are handed to `record` as soon as they
are computed (the fidelity stage commits them, one transaction a step). A stored failed generation is not done:
it is asked again.

Every step is scored by evaluation's scorer (pipeline/evaluation/scoring.py, one rule for every model): its
judge on 0-100 (the offline similarity judge by default; an LLM judge where `evaluate.judge` configures one,
whose invalid answers leave the step without a score) and exact match after masking runtime metadata
(pipeline/evaluation/metrics.py: pids, timestamps and random ids compared by their class, not literally).
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pipeline.evaluation.metrics import agentworldbench_score
from pipeline.evaluation.scoring import GENERATION_FAILED, Prediction, Scorer
from pipeline.fidelity.simulators import Simulator, SimulatorRequest
from pipeline.fidelity.trajectories import HeldOutTrajectory
from pipeline.progress import progress_bar
from pipeline.sft.queries import Query, query_at
from pipeline.store.schema import ScoredTurn

OPEN_LOOP = "open"
CLOSED_LOOP = "closed"
MODES = (OPEN_LOOP, CLOSED_LOOP)


@dataclass(frozen=True, slots=True)
class ScoredStep:
    trajectory_id: str
    domain: str
    mode: str  # open or closed
    step: int  # 1: the trajectory's first environment turn
    turn_index: int
    history_left_out: int  # earlier turns that did not fit in max_history_chars
    prediction: str | None  # the observation the answer yields; None: it yields none
    parse_status: str
    score: float | None  # the judge's, 0-100; None: failed generation or invalid judgement
    similarity: float | None  # the offline similarity judge's, 0-1
    exact_match: bool | None  # after masking runtime metadata
    error: str | None  # a failed generation's


@dataclass(frozen=True, slots=True)
class Rollouts:
    simulator: str
    judge: str  # the scorer's name: scores are comparable under one judge only
    steps: tuple[ScoredStep, ...]  # by step, then mode, then trajectory in the order given


def step_query(
    trajectory: HeldOutTrajectory, step: int, fed_back: dict[int, str] | None, max_history_chars: int | None
) -> Query:
    """Step `step` (1-based) of the trajectory as a query: its action, the real observation as the reference,
    and the history before it, where `fed_back` (position -> predicted observation; None in the open loop)
    replaces the real observations of the earlier steps."""
    position = trajectory.steps[step - 1]
    earlier: list[ScoredTurn] = [
        replace(turn, observation=fed_back[i]) if fed_back is not None and i in fed_back else turn
        for i, turn in enumerate(trajectory.turns[:position])
    ]
    return query_at(
        trajectory.trajectory_id,
        trajectory.domain,
        trajectory.system,
        earlier,
        trajectory.turns[position],
        max_history_chars,
    )


def _request(trajectory: HeldOutTrajectory, query: Query) -> SimulatorRequest:
    return SimulatorRequest(
        query.trajectory_id,
        query.turn_index,
        query.domain,
        query.system,
        trajectory.own_system_prompt,
        query.history,
        query.action,
    )


# A scored step by (trajectory id, mode, step): what an earlier run of the same rollout stored.
StepKey = tuple[str, str, int]


def roll_out(
    trajectories: Sequence[HeldOutTrajectory],
    simulator: Simulator,
    scorer: Scorer,
    max_history_chars: int | None,
    modes: Sequence[str] = MODES,
    done: Mapping[StepKey, ScoredStep] | None = None,
    record: Callable[[Sequence[ScoredStep]], None] | None = None,
) -> Rollouts:
    """Every step of every trajectory in each mode, asked a step at a time (one simulator call per step)
    and scored as evaluation scores; the steps in `done` are taken as they are, each step's new ones are
    given to `record`."""
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        raise ValueError(f"unknown rollout mode(s) {unknown}; modes are {', '.join(MODES)}")
    done = {key: kept for key, kept in (done or {}).items() if kept.parse_status != GENERATION_FAILED}
    fed_back: dict[str, dict[int, str]] = {t.trajectory_id: {} for t in trajectories}  # the closed loop's
    stopped: set[str] = set()  # closed loops whose generation failed
    scored: list[ScoredStep] = []
    longest = max((len(t.steps) for t in trajectories), default=0)
    with progress_bar(f"fidelity {simulator.name}: steps rolled out", total=longest) as advance:
        for step in range(1, longest + 1):
            asked: list[tuple[str, HeldOutTrajectory, Query]] = []
            for mode in modes:
                for trajectory in trajectories:
                    if len(trajectory.steps) < step or (mode == CLOSED_LOOP and trajectory.trajectory_id in stopped):
                        continue
                    kept = done.get((trajectory.trajectory_id, mode, step))
                    if kept is not None:
                        scored.append(kept)
                        if mode == CLOSED_LOOP:
                            _feed_back(fed_back, stopped, trajectory, step, _stored_prediction(kept))
                        continue
                    own = fed_back[trajectory.trajectory_id] if mode == CLOSED_LOOP else None
                    asked.append((mode, trajectory, step_query(trajectory, step, own, max_history_chars)))
            if asked:
                predictions = simulator.observations([_request(t, query) for _, t, query in asked])
                if len(predictions) != len(asked):
                    raise ValueError(f"simulator {simulator.name} answered {len(predictions)} of {len(asked)} requests")
                markers = [t.response_marker for _, t, _ in asked]
                rows = scorer.rows([query for _, _, query in asked], predictions, markers)
                new = []
                for (mode, trajectory, query), prediction, row in zip(asked, predictions, rows):
                    new.append(_scored_step(trajectory, mode, step, query, prediction, row))
                    if mode == CLOSED_LOOP:
                        _feed_back(fed_back, stopped, trajectory, step, prediction)
                scored += new
                if record is not None:
                    record(new)
            advance(1)
    return Rollouts(simulator.name, scorer.name, tuple(sorted(scored, key=_rollout_order(modes, trajectories))))


def _rollout_order(modes: Sequence[str], trajectories: Sequence[HeldOutTrajectory]):
    """By step, then mode, then trajectory in the order given: how an uninterrupted run lists its steps."""
    position = {t.trajectory_id: i for i, t in enumerate(trajectories)}
    return lambda s: (s.step, list(modes).index(s.mode), position[s.trajectory_id])


def _stored_prediction(step: ScoredStep) -> Prediction:
    return Prediction(step.parse_status, step.prediction, None, step.error)


def _feed_back(
    fed_back: dict[str, dict[int, str]],
    stopped: set[str],
    trajectory: HeldOutTrajectory,
    step: int,
    prediction: Prediction,
) -> None:
    if prediction.status == GENERATION_FAILED:
        stopped.add(trajectory.trajectory_id)
        return
    fed_back[trajectory.trajectory_id][trajectory.steps[step - 1]] = prediction.observation or ""


def _scored_step(
    trajectory: HeldOutTrajectory, mode: str, step: int, query: Query, prediction: Prediction, row: dict
) -> ScoredStep:
    raw = row.get("judge_raw")
    return ScoredStep(
        trajectory.trajectory_id,
        trajectory.domain,
        mode,
        step,
        query.turn_index,
        query.history_left_out,
        prediction.observation,
        prediction.status,
        None if raw is None else agentworldbench_score(raw),
        row.get("similarity"),
        row.get("exact_match"),
        prediction.error,
    )
