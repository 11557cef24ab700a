"""Closed-loop fidelity and policy agreement of every simulator (issue 31): can an agent trust it, and for how
many steps?

Read top to bottom, `run` does:
1. the held-out trajectories: the eval pool's, a seeded choice of `fidelity.max_trajectories`, each cut after
   `fidelity.max_steps` environment turns (pipeline/fidelity/trajectories.py); or, with `--data`, the
   trajectories of benchmark files, read as given (nothing is ingested);
2. the simulators: the models evaluation measures (stages/evaluate.py's `default_models`: the base model and the
   newest registered checkpoint of cpt, sft and rl, or the one export ships with `evaluate.checkpoints: shipped`;
   or the `--checkpoint` folders, `named_models`), each asked in the format it was trained in (an exported
   folder in the one its `simulacra.json` records), then the retrieval baseline (SFT's nearest-neighbour
   generator over the cpt pool);
3. the real episodes, once for every simulator since they do not depend on one: each policy of the ladder
   (pipeline/fidelity/policies.py) on tasks 0..N-1 (`fidelity.episodes_per_policy`) of each environment of
   `fidelity.environments`, in the real engines (pipeline/environments/), success by the task's own check;
4. per model: `simulacra serve` of its folder on 127.0.0.1 (pipeline/serving/local_server.py). An exported
   folder is served as it is; any other model folder (the base model, a cpt, sft or rl checkpoint) is first
   written as the export stage writes a folder (the chat template and `simulacra.json` of the format it was
   trained in, the context length and history budget an export of it would record) into a scratch folder,
   removed when the model is done. Through that one server: the rollouts, closed and open loop, a step a
   batched call (pipeline/fidelity/rollouts.py), scored by evaluation's scorer (its judge, exact match after
   masking runtime metadata; a prompt the server refuses as longer than the model's context is the simulator's
   answer, scored as the empty observation: pipeline/fidelity/simulators.py `ServedSimulator`); then the
   episodes of step 3 in the simulator, `fidelity.episodes_together` at a
   time through the vector environment (pipeline/fidelity/simulated_episodes.py `play_together`). A model
   whose steps and episodes are all stored is not served at all. The retrieval baseline cannot be served (it is
   no language model): its rollouts ask it in-process, and its episodes play through `SimulatorEnv`, a gymnasium
   environment with the served one's interface;
5. per simulator, the curves (pipeline/fidelity/curves.py: per domain, the score against step, open and closed,
   with 95% intervals, the paired gap, the Kaplan-Meier median steps to the first divergence below
   `fidelity.divergence_threshold`) and the policy agreement (pipeline/fidelity/agreement.py: success rates
   with Wilson intervals, simulated - real paired, Kendall's tau-b over the policies, per environment and
   overall); then under `runs/fidelity/<digest>/` the fidelity table and a PNG per simulator, the agreement
   table and `report.json`, and a row per model in `fidelity_reports`, which the export's model card quotes.

Resumable. Every scored step is committed with its step's others as soon as it is scored (`fidelity_steps`),
every episode as soon as it ends (`fidelity_episodes`, the real ones under simulator `real`), each keyed by
the fingerprint of what it depends on (`inputs`: for steps, how they are asked and judged and the code; for
episodes, the code and, in a simulator, its sampling) and the simulator. A rerun after a kill plays no episode
and scores no step it had stored (the closed loop feeds back the stored predictions), and asks the model
nothing it had answered (the LLM cache). A failed generation or a failed episode request is stored as such
and tried again by the next run.
"""

import json
import shutil
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError
from pipeline.evaluation.prompting import RETRIEVAL
from pipeline.evaluation.scoring import GENERATION_FAILED, Scorer
from pipeline.fidelity.agreement import ALL_ENVIRONMENTS, Outcome, PolicyAgreement, agreement_table, policy_agreement
from pipeline.fidelity.curves import ALL_DOMAINS, FidelityCurves, fidelity_curves, fidelity_plot, fidelity_table
from pipeline.fidelity.episodes import EpisodeRecord, run_episode
from pipeline.fidelity.policies import policy_ladder
from pipeline.fidelity.rollouts import CLOSED_LOOP, MODES, OPEN_LOOP, Rollouts, ScoredStep, StepKey, roll_out
from pipeline.fidelity.simulated_episodes import FAILED, EpisodeJob, SimulatorEnv, play_together
from pipeline.fidelity.simulators import CONTEXT_EXCEEDED
from pipeline.fidelity.trajectories import HeldOutSet, benchmark_trajectories, pool_trajectories
from pipeline.orchestration.faults import maybe_fail
from pipeline.orchestration.fingerprint import code_version
from pipeline.progress import progress_bar
from pipeline.sft.sampling import digest
from pipeline.stage import StageResult
from pipeline.store.prerequisites import require_ingested
from pipeline.store.snapshot import export_snapshot, pools_fingerprint
from stages.evaluate import EvaluatedModel, baseline_model, default_models, named_models

STAGE = "fidelity"
REAL = "real"  # the `simulator` of an episode played in the real environment
REPORT_FILE = "report.json"
FIDELITY_TABLE = "fidelity.txt"
AGREEMENT_TABLE = "agreement.txt"
STEP_COLUMNS = (
    "trajectory_id",
    "domain",
    "mode",
    "step",
    "turn_index",
    "history_left_out",
    "prediction",
    "parse_status",
    "score",
    "similarity",
    "exact_match",
    "error",
)


class FidelityInputError(UserFixableError, ValueError):
    """A user-fixable problem with what was asked: no held-out trajectory, no model, a model that is no folder."""


@dataclass(frozen=True, slots=True)
class Simulated:
    """One simulator's results: its rollouts' curves and its policy agreement (None without environments)."""

    model: EvaluatedModel
    curves: FidelityCurves
    agreement: PolicyAgreement | None
    # Steps whose prompt the server refused as past the model's context (scored as empty answers), of all steps asked:
    # a simulator that cannot take the trajectories' prompts diverges at once, and the summary must say why.
    past_context: int = 0
    steps: int = 0


# -- 1. the held-out trajectories ------------------------------------------------------------------
def held_out_set(config, store, snapshot: Path, data: list[str] | None) -> HeldOutSet:
    fidelity = config.fidelity
    if data:
        read = benchmark_trajectories(data, fidelity.max_trajectories, fidelity.seed, fidelity.max_steps)
        if not read.trajectories:
            counts = read.counts
            raise FidelityInputError(
                f"no trajectory with an environment turn to roll out in {', '.join(data)}: {counts['records_read']} "
                f"records read, {counts['records_failed']} failed to parse"
            )
        return read
    require_ingested(store)
    held_out = pool_trajectories(store, snapshot, fidelity.max_trajectories, fidelity.seed, fidelity.max_steps)
    if not held_out.trajectories:
        raise FidelityInputError(
            "no eval-pool trajectory to roll out: run `simulacra split` first (with an eval share), or give --data FILE"
        )
    return held_out


# -- 2. the simulators -----------------------------------------------------------------------------
def _exported_format(folder: Path) -> str | None:
    """The answer format (evaluation's name) an exported folder's `simulacra.json` records, or None."""
    from pipeline.prompts.answer_format import FORMATS
    from pipeline.serving.export_folder import METADATA_FILE

    path = folder / METADATA_FILE
    if not path.is_file():
        return None
    recorded = json.loads(path.read_text())
    return next(
        (
            f.name
            for f in FORMATS.values()
            if (f.template, f.thinking) == (recorded["prompt_format"], recorded["thinking"])
        ),
        None,
    )


def simulators(config, store, checkpoints: list[str] | None, thinking: bool) -> list[EvaluatedModel]:
    """The models, each a local folder in the format it answers in; then the retrieval baseline."""
    models = named_models(config, store, checkpoints, thinking) if checkpoints else default_models(config, store)
    if not models:
        raise FidelityInputError("no model to measure: run `simulacra cpt` first, or give --checkpoint PATH")
    chosen = []
    for model in models:
        if model.path is None or not (Path(model.path) / "config.json").is_file():
            raise FidelityInputError(
                f"--checkpoint {model.path}: not a model folder; fidelity serves each model itself "
                "(`simulacra serve`), so it needs the folder, not a served name"
            )
        exported = _exported_format(Path(model.path))
        chosen.append(replace(model, prompt_format=exported) if exported else model)
    baseline = baseline_model(config, store)
    return chosen + ([baseline] if baseline is not None else [])


def simulator_key(model: EvaluatedModel) -> str:
    """What stored steps and episodes are keyed by: the model and the format it is asked in."""
    return f"{model.checkpoint_id}/{model.prompt_format}"


# -- inputs: what a stored step or episode depends on besides the simulator ------------------------
def rollout_inputs(config, scorer: Scorer) -> str:
    """How a step is asked and judged, and the code. Not the trajectory budget or the cut: step k of a
    trajectory is the same step whatever comes after it, so a larger budget reuses the steps it has."""
    predictor = config.evaluate.predictor
    asked = (predictor.temperature, predictor.top_p, predictor.seed, config.fidelity.max_tokens)
    return digest("fidelity-steps", asked, config.evaluate.max_history_chars, scorer.fingerprint, code_version(STAGE))


def real_inputs() -> str:
    """The engines, the deals, the policies and the runner: all in the stage's code."""
    return digest("fidelity-real-episodes", code_version(STAGE))


def simulated_inputs(config) -> str:
    return digest(
        "fidelity-simulated-episodes", code_version(STAGE), config.fidelity.max_tokens, config.fidelity.temperature
    )


# -- 3. episodes -----------------------------------------------------------------------------------
def episode_jobs(config) -> list[EpisodeJob]:
    from pipeline.environments.demo_environments import DEMO_ENVIRONMENTS

    jobs = []
    for environment in config.fidelity.environments:
        kind = DEMO_ENVIRONMENTS[environment]
        for seed in range(config.fidelity.episodes_per_policy):
            task = kind.task(seed)
            jobs += [EpisodeJob(environment, policy, seed, task) for policy in policy_ladder()]
    return jobs


def _stored_episodes(store, inputs: str, simulator: str) -> dict[tuple[str, str, int], dict[str, Any]]:
    rows = store.rows(
        "SELECT environment, policy, seed, success, steps, ending, error FROM fidelity_episodes "
        "WHERE inputs = ? AND simulator = ?",
        [inputs, simulator],
    )
    return {(row["environment"], row["policy"], row["seed"]): row for row in rows}


def _finished(stored: dict[tuple[str, str, int], dict[str, Any]], job: EpisodeJob) -> bool:
    row = stored.get((job.environment, job.policy.name, job.seed))
    return row is not None and row["ending"] != FAILED


def _record_episode(store, inputs: str, simulator: str, job: EpisodeJob, record: EpisodeRecord, error: str | None):
    with store.transaction() as tx:
        tx.execute(
            "INSERT OR REPLACE INTO fidelity_episodes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                inputs,
                simulator,
                job.environment,
                job.policy.name,
                job.seed,
                record.success,
                record.steps,
                record.end,
                json.dumps([list(pair) for pair in record.history]),
                error,
                datetime.now(),
            ],
        )


def play_real(config, store, jobs: list[EpisodeJob]) -> int:
    """Every job not yet stored, in the real environment; returns how many were played."""
    from pipeline.environments.demo_environments import DEMO_ENVIRONMENTS

    inputs = real_inputs()
    stored = _stored_episodes(store, inputs, REAL)
    todo = [job for job in jobs if not _finished(stored, job)]
    environments = {}
    try:
        with progress_bar("fidelity: real episodes played", total=len(todo)) as advance:
            for job in todo:
                if job.environment not in environments:
                    environments[job.environment] = DEMO_ENVIRONMENTS[job.environment].make()
                record = run_episode(job.policy, environments[job.environment], job.task, job.seed)
                _record_episode(store, inputs, REAL, job, record, None)
                advance(1)
    finally:
        for env in environments.values():
            env.close()
    return len(todo)


def _play_simulated(config, store, model: EvaluatedModel, jobs: list[EpisodeJob], served, baseline) -> int:
    """The jobs not yet stored for this simulator: through the server, or the baseline's `SimulatorEnv`."""
    inputs, key = simulated_inputs(config), simulator_key(model)
    stored = _stored_episodes(store, inputs, key)
    todo = [job for job in jobs if not _finished(stored, job)]
    with progress_bar(f"fidelity {model.model}: simulated episodes played", total=len(todo)) as advance:

        def ended(job: EpisodeJob, record: EpisodeRecord, error: str | None) -> None:
            _record_episode(store, inputs, key, job, record, error)
            advance(1)
            # `orchestration.fail_stage: fidelity` fails once, after the first simulated episode is committed.
            maybe_fail(config, STAGE, f"after an episode of {model.model}")

        if served is not None:
            fidelity = config.fidelity
            for environment in dict.fromkeys(job.environment for job in todo):
                play_together(
                    served.base_url,
                    served.model,
                    environment,
                    [job for job in todo if job.environment == environment],
                    fidelity.episodes_together,
                    ended,
                    max_tokens=fidelity.max_tokens,
                    temperature=fidelity.temperature,
                )
        else:
            for job in todo:
                env = SimulatorEnv(baseline, job.environment)
                try:
                    record = run_episode(job.policy, env, job.task, job.seed, job.task.episode_options())
                    ended(job, record, None)
                except RuntimeError as exc:  # the generation failed: stored as failed, played again next run
                    ended(job, EpisodeRecord(job.policy.name, job.seed, False, 0, FAILED, ()), str(exc))
    return len(todo)


def outcomes(store, inputs: str, simulator: str, jobs: list[EpisodeJob]) -> list[Outcome]:
    """The finished episodes of these jobs (a failed one is left out: it did not finish)."""
    stored = _stored_episodes(store, inputs, simulator)
    return [
        Outcome(job.environment, job.policy.name, job.seed, bool(row["success"]))
        for job in jobs
        if (row := stored.get((job.environment, job.policy.name, job.seed))) is not None and row["ending"] != FAILED
    ]


# -- 4. rollouts -----------------------------------------------------------------------------------
def _stored_steps(store, inputs: str, simulator: str) -> dict[StepKey, ScoredStep]:
    rows = store.rows(
        f"SELECT {', '.join(STEP_COLUMNS)} FROM fidelity_steps WHERE inputs = ? AND simulator = ?",
        [inputs, simulator],
    )
    steps = [ScoredStep(**row) for row in rows]
    return {(s.trajectory_id, s.mode, s.step): s for s in steps}


def _expected_steps(held_out: HeldOutSet) -> set[StepKey]:
    return {
        (t.trajectory_id, mode, step)
        for t in held_out.trajectories
        for mode in MODES
        for step in range(1, len(t.steps) + 1)
    }


def _all_scored(done: dict[StepKey, ScoredStep], held_out: HeldOutSet) -> bool:
    return all(key in done and done[key].parse_status != GENERATION_FAILED for key in _expected_steps(held_out))


def _stored_rollouts(
    model: EvaluatedModel, held_out: HeldOutSet, scorer: Scorer, done: dict[StepKey, ScoredStep]
) -> Rollouts:
    """The rollouts of a model whose every step is stored, in the order `roll_out` gives them."""
    position = {t.trajectory_id: i for i, t in enumerate(held_out.trajectories)}
    steps = sorted(
        (done[key] for key in _expected_steps(held_out)),
        key=lambda s: (s.step, MODES.index(s.mode), position[s.trajectory_id]),
    )
    return Rollouts(model.model, scorer.name, tuple(steps))


def _record_steps(store, inputs: str, simulator: str, steps) -> None:
    now = datetime.now()
    with store.transaction() as tx:
        tx.executemany(
            f"INSERT OR REPLACE INTO fidelity_steps (inputs, simulator, {', '.join(STEP_COLUMNS)}, created_at) "
            f"VALUES ({', '.join('?' * (len(STEP_COLUMNS) + 3))})",
            [[inputs, simulator, *(getattr(s, c) for c in STEP_COLUMNS), now] for s in steps],
        )


def _roll_out(config, store, model: EvaluatedModel, held_out: HeldOutSet, scorer: Scorer, simulator) -> Rollouts:
    inputs, key = rollout_inputs(config, scorer), simulator_key(model)
    return roll_out(
        held_out.trajectories,
        simulator,
        scorer,
        config.evaluate.max_history_chars,
        done=_stored_steps(store, inputs, key),
        record=lambda steps: _record_steps(store, inputs, key, steps),
    )


def _served_folder(config, model: EvaluatedModel, scratch: Path) -> Path:
    """The model's folder as `simulacra serve` takes it: an exported folder as it is; any other written as
    the export stage writes one, in the format the model was trained in (a scratch copy)."""
    from pipeline.prompts.answer_format import answer_format
    from pipeline.serving.export_folder import METADATA_FILE, write_export
    from pipeline.serving.prompt_formats import prompt_format
    from pipeline.serving.provenance import context_length, max_history_chars

    source = Path(model.path)  # type: ignore[arg-type]  # a model, not the baseline: a folder
    if (source / METADATA_FILE).is_file():
        return source
    trained = answer_format(model.prompt_format)
    fmt = prompt_format(trained.template, trained.thinking)
    stage = model.stage if model.stage in ("cpt", "sft", "rl") else None
    metadata = {
        "model_name": f"fidelity-{model.checkpoint_id}",
        "fingerprint": model.fingerprint,
        "source_checkpoint": model.checkpoint_id,
        "context_length": context_length(config, stage, fmt.name, source),
        "max_history_chars": max_history_chars(config, stage, fmt.name),
    }
    card = f"# {model.model}\n\nA scratch copy for `simulacra fidelity`, removed when it is done.\n"
    return write_export(source, scratch / model.checkpoint_id, fmt, metadata, card)


def _served_simulator(config, store, model: EvaluatedModel, served):
    from pipeline.config.llm import EndpointConfig
    from pipeline.fidelity.simulators import ServedSimulator
    from pipeline.llm.client import open_client

    predictor = config.evaluate.predictor
    endpoint = EndpointConfig(
        backend="openai",
        base_url=served.base_url,
        model=served.model,
        api_key_env=None,  # our own server on the loopback interface: no key to send
        temperature=predictor.temperature,
        top_p=predictor.top_p,
        seed=predictor.seed,
        max_tokens=config.fidelity.max_tokens,
        concurrency=config.fidelity.episodes_together,
        max_failed_fraction=1.0,  # the simulator tells a refused prompt from a failure, and counts these
    )
    client = open_client(endpoint, store, f"fidelity.{model.stage}")
    return ServedSimulator(model.model, client, model.prompt_format, predictor.max_failed_fraction)


def measure_model(
    config, store, model: EvaluatedModel, held_out: HeldOutSet, scorer: Scorer, jobs: list[EpisodeJob], scratch: Path
) -> tuple[Rollouts, int]:
    """One model's rollouts and simulated episodes, through one server; (rollouts, episodes played)."""
    from pipeline.serving.local_server import served_folder

    steps_inputs, key = rollout_inputs(config, scorer), simulator_key(model)
    stored = _stored_episodes(store, simulated_inputs(config), key)
    done = _stored_steps(store, steps_inputs, key)
    if _all_scored(done, held_out) and all(_finished(stored, job) for job in jobs):
        return _stored_rollouts(model, held_out, scorer, done), 0  # everything stored: no server, nothing asked
    folder = _served_folder(config, model, scratch)
    try:
        log = config.workspace.runs_dir / STAGE / "serve" / f"{model.checkpoint_id}.log"
        with served_folder(
            folder, log=log, max_tokens=config.fidelity.max_tokens, device=config.evaluate.predictor.device
        ) as served:
            rollouts = _roll_out(
                config, store, model, held_out, scorer, _served_simulator(config, store, model, served)
            )
            played = _play_simulated(config, store, model, jobs, served, None)
    finally:
        if folder.is_relative_to(scratch):
            shutil.rmtree(folder, ignore_errors=True)
    return rollouts, played


def measure_baseline(
    config, store, model: EvaluatedModel, held_out: HeldOutSet, scorer: Scorer, jobs: list[EpisodeJob], snapshot: Path
) -> tuple[Rollouts, int]:
    from pipeline.fidelity.simulators import RetrievalSimulator

    baseline = RetrievalSimulator(snapshot, config.evaluate.baseline_history_turns, model.model)
    rollouts = _roll_out(config, store, model, held_out, scorer, baseline)
    return rollouts, _play_simulated(config, store, model, jobs, None, baseline)


# -- 5. the report ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Headline:
    """What a summary and the model card quote of one simulator, over all domains and environments."""

    trajectories: int
    threshold: float
    median_closed: int | None  # Kaplan-Meier median steps to the first divergence; None: not reached
    followed_closed: int  # the longest closed-loop follow-up (a median not reached is more than this)
    diverged_closed: int
    median_open: int | None
    followed_open: int
    step: int | None  # the step the two loops are compared at: the last that half the trajectories reach
    closed: float | None  # mean score there, 0-100
    open: float | None
    gap: dict[str, Any]  # closed - open there, paired: mean, low, high, n
    kendall_tau: float | None  # over the policies' rates, all environments pooled; None: none or undefined
    tau_why: str | None
    policies: int
    environments: list[str]
    past_context: int = 0  # steps refused as past the model's context, scored as empty answers
    steps: int = 0

    def words(self) -> str:
        def median(value: int | None, followed: int) -> str:
            return f"more than {followed}" if value is None else str(value)

        parts = [
            f"median steps to first divergence {median(self.median_closed, self.followed_closed)} closed loop / "
            f"{median(self.median_open, self.followed_open)} open"
        ]
        if self.step is not None and self.closed is not None and self.open is not None:
            gap = self.gap
            interval = "" if gap["low"] is None else f" [{gap['low']:+.1f}, {gap['high']:+.1f}]"
            parts.append(
                f"at step {self.step} closed {self.closed:.1f} vs open {self.open:.1f} ({gap['mean']:+.1f}{interval})"
            )
        if self.environments:
            tau = f"{self.kendall_tau:+.2f}" if self.kendall_tau is not None else f"undefined ({self.tau_why})"
            parts.append(f"Kendall tau-b {tau} over {self.policies} policies")
        if self.past_context:
            parts.append(
                f"{self.past_context} of {self.steps} steps past the model's context (scored as empty answers: "
                "fewer history turns, `evaluate.max_history_chars`, or a model of a longer context)"
            )
        return ", ".join(parts)


def compared_step(curves: FidelityCurves, trajectories: int) -> int | None:
    """The last step at which at least half the trajectories are scored in both loops (all domains)."""
    steps = [
        point.step
        for point in curves.points
        if point.domain == ALL_DOMAINS and point.mode == CLOSED_LOOP and point.score.n * 2 >= trajectories
    ]
    opened = {p.step for p in curves.points if p.domain == ALL_DOMAINS and p.mode == OPEN_LOOP}
    steps = [step for step in steps if step in opened]
    return max(steps) if steps else None


def headline(result: Simulated, trajectories: int) -> Headline:
    curves = result.curves
    medians = {(m.domain, m.mode): m for m in curves.medians}
    closed, opened = medians.get((ALL_DOMAINS, CLOSED_LOOP)), medians.get((ALL_DOMAINS, OPEN_LOOP))
    step = compared_step(curves, trajectories)
    points = {(p.mode, p.step): p for p in curves.points if p.domain == ALL_DOMAINS}
    gap = next((g.gap for g in curves.gaps if g.domain == ALL_DOMAINS and g.step == step), None)
    agreement = result.agreement
    rank = next((r for r in agreement.ranks if r.environment == ALL_ENVIRONMENTS), None) if agreement else None
    return Headline(
        trajectories=trajectories,
        threshold=curves.threshold,
        median_closed=closed.median if closed else None,
        followed_closed=closed.longest if closed else 0,
        diverged_closed=closed.diverged if closed else 0,
        median_open=opened.median if opened else None,
        followed_open=opened.longest if opened else 0,
        step=step,
        closed=points[(CLOSED_LOOP, step)].score.mean if step is not None else None,
        open=points[(OPEN_LOOP, step)].score.mean if step is not None else None,
        gap=gap.as_dict() if gap is not None else {"mean": None, "low": None, "high": None, "n": 0},
        kendall_tau=rank.tau if rank else None,
        tau_why=rank.why if rank else None,
        policies=rank.policies if rank else 0,
        environments=sorted({r.environment for r in agreement.rates} - {ALL_ENVIRONMENTS}) if agreement else [],
        past_context=result.past_context,
        steps=result.steps,
    )


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def _curve_rows(results: list[Simulated]) -> list[dict[str, Any]]:
    gaps = {(r.model.model, g.domain, g.step): g.gap for r in results for g in r.curves.gaps}
    rows = []
    for result in results:
        for point in result.curves.points:
            gap = gaps.get((result.model.model, point.domain, point.step)) if point.mode == CLOSED_LOOP else None
            rows.append(
                {
                    "simulator": result.model.model,
                    "domain": point.domain,
                    "mode": point.mode,
                    "step": point.step,
                    "trajectories": point.score.n,
                    "score": point.score.text(),
                    "exact_match": None if point.exact_match.mean is None else round(point.exact_match.mean, 3),
                    "closed_minus_open": gap.text(signed=True) if gap is not None else None,
                }
            )
    return rows


def _divergence_rows(results: list[Simulated]) -> list[dict[str, Any]]:
    return [
        {
            "simulator": r.model.model,
            "domain": m.domain,
            "mode": m.mode,
            "trajectories": m.trajectories,
            "diverged": m.diverged,
            "median_steps": m.median,
            "steps_to_first_divergence": m.text(),
        }
        for r in results
        for m in r.curves.medians
    ]


def _agreement_rows(results: list[Simulated]) -> list[dict[str, Any]]:
    return [
        {
            "simulator": r.model.model,
            "environment": row.environment,
            "policy": row.policy,
            "episodes_real": row.real.n,
            "episodes_simulated": row.simulated.n,
            "real": row.real.text(digits=2),
            "simulated": row.simulated.text(digits=2),
            "simulated_minus_real": row.difference.text(signed=True, digits=2),
            "pairs": row.difference.n,
        }
        for r in results
        if r.agreement is not None
        for row in r.agreement.rates
    ]


def _rank_rows(results: list[Simulated]) -> list[dict[str, Any]]:
    return [
        {
            "simulator": r.model.model,
            "environment": rank.environment,
            "policies": rank.policies,
            "kendall_tau_b": rank.tau,
            "why": rank.why,
        }
        for r in results
        if r.agreement is not None
        for rank in r.agreement.ranks
    ]


def _report(results: list[Simulated], headlines: dict[str, Headline], held_out: HeldOutSet, scorer: Scorer) -> dict:
    return {
        "held_out": held_out.name,
        "held_out_counts": held_out.counts,
        "judge": scorer.name,
        "judge_fingerprint": scorer.fingerprint,
        "scores": "the judge's score of each step's prediction against the real observation, 0-100; mean and 95% "
        "bootstrap interval over the trajectories scored at that step",
        "divergence": "steps to the first step scoring below the threshold; Kaplan-Meier median over trajectories, "
        "a trajectory that never diverged censored at its last step",
        "success_rates": "share of episodes whose task check passed, 95% Wilson interval; simulated - real paired "
        "on the same policy, task and seed, Newcombe's interval; Kendall tau-b between the policies' rates",
        "simulators": [
            {
                "model": r.model.model,
                "checkpoint_id": r.model.checkpoint_id,
                "stage": r.model.stage,
                "prompt_format": r.model.prompt_format,
                "headline": asdict(headlines[r.model.checkpoint_id]),
                "curves": [
                    {
                        "domain": p.domain,
                        "mode": p.mode,
                        "step": p.step,
                        "score": p.score.as_dict(),
                        "exact_match": p.exact_match.as_dict(),
                    }
                    for p in r.curves.points
                ],
                "gaps": [{"domain": g.domain, "step": g.step, "gap": g.gap.as_dict()} for g in r.curves.gaps],
                "divergence": [asdict(m) for m in r.curves.medians],
                "trajectories": [asdict(d) for d in r.curves.divergences],
                "agreement": None
                if r.agreement is None
                else {
                    "rates": [
                        {
                            "environment": row.environment,
                            "policy": row.policy,
                            "real": row.real.as_dict(),
                            "simulated": row.simulated.as_dict(),
                            "simulated_minus_real": row.difference.as_dict(),
                        }
                        for row in r.agreement.rates
                    ],
                    "kendall_tau_b": [asdict(rank) for rank in r.agreement.ranks],
                },
            }
            for r in results
        ],
    }


def _register(
    store, report_id: str, results: list[Simulated], headlines: dict[str, Headline], judge: str, report: Path
):
    with store.transaction() as tx:
        for r in results:
            tx.execute(
                "INSERT OR REPLACE INTO fidelity_reports VALUES (?, ?, ?, ?, ?, ?, ?, now())",
                [
                    report_id,
                    r.model.checkpoint_id,
                    r.model.model,
                    r.model.stage,
                    judge,
                    json.dumps(asdict(headlines[r.model.checkpoint_id])),
                    str(report),
                ],
            )


def run(
    config, store, checkpoints: list[str] | None = None, data: list[str] | None = None, thinking: bool = False
) -> StageResult:
    runs = config.workspace.runs_dir / STAGE
    pools = pools_fingerprint(store, ("cpt", "eval"))
    snapshot = export_snapshot(store, runs / "snapshots" / pools.replace(":", "-"), ("cpt", "eval"))
    held_out = held_out_set(config, store, snapshot, data)
    models = simulators(config, store, checkpoints, thinking)
    scorer = Scorer(config.evaluate, store)
    jobs = episode_jobs(config)
    played_real = play_real(config, store, jobs)
    real = outcomes(store, real_inputs(), REAL, jobs)
    policies = [policy.name for policy in policy_ladder()]
    results, played = [], 0
    for model in models:
        if model.prompt_format == RETRIEVAL:
            rollouts, count = measure_baseline(config, store, model, held_out, scorer, jobs, snapshot)
        else:
            rollouts, count = measure_model(config, store, model, held_out, scorer, jobs, runs / "served")
        played += count
        simulated = outcomes(store, simulated_inputs(config), simulator_key(model), jobs)
        agreement = policy_agreement(model.model, real, simulated, policies) if jobs else None
        curves = fidelity_curves(rollouts, config.fidelity.divergence_threshold)
        refused = sum(step.parse_status == CONTEXT_EXCEEDED for step in rollouts.steps)
        results.append(Simulated(model, curves, agreement, refused, len(rollouts.steps)))
    if scorer.client is not None:
        scorer.client.check_failures()

    trajectories = len(held_out.trajectories)
    headlines = {r.model.checkpoint_id: headline(r, trajectories) for r in results}
    report_id = digest(
        "fidelity-report",
        rollout_inputs(config, scorer),
        simulated_inputs(config),
        sorted(simulator_key(r.model) for r in results),
        [t.trajectory_id for t in held_out.trajectories],
        [len(t.steps) for t in held_out.trajectories],
        [(job.environment, job.seed) for job in jobs],
        config.fidelity.divergence_threshold,
    )
    output_dir = runs / report_id
    output_dir.mkdir(parents=True, exist_ok=True)
    images = {
        f"fidelity-{_slug(r.model.model)}": fidelity_plot(r.curves, output_dir / f"fidelity-{_slug(r.model.model)}.png")
        for r in results
    }
    (output_dir / FIDELITY_TABLE).write_text("\n".join(fidelity_table(r.curves) for r in results))
    agreements = [r.agreement for r in results if r.agreement is not None]
    if agreements:
        (output_dir / AGREEMENT_TABLE).write_text(agreement_table(agreements))
    report = output_dir / REPORT_FILE
    report.write_text(json.dumps(_report(results, headlines, held_out, scorer), indent=2, default=str) + "\n")
    _register(store, report_id, results, headlines, scorer.name, report)

    episodes = (
        f"episodes of {len(policies)} policies x {config.fidelity.episodes_per_policy} tasks in "
        + ", ".join(config.fidelity.environments)
        if config.fidelity.environments
        else "no policy episodes (fidelity.environments is empty)"
    )
    summary = (
        f"{len(results)} simulators on {held_out.name}, judge {scorer.name}, {episodes}: "
        + "; ".join(f"{r.model.model}: {headlines[r.model.checkpoint_id].words()}" for r in results)
        + f" ({played_real} real and {played} simulated episodes played this run)"
    )
    metrics: dict[str, Any] = {
        "simulators": len(results),
        "trajectories": trajectories,
        "steps": held_out.counts.get("steps"),
        "held_out": held_out.name,
        "judge": scorer.name,
        "real_episodes_played": played_real,
        "simulated_episodes_played": played,
        "report": str(report),
    }
    for r in results:
        h = headlines[r.model.checkpoint_id]
        metrics[f"median_divergence_closed.{r.model.model}"] = h.median_closed
        metrics[f"median_divergence_open.{r.model.model}"] = h.median_open
        metrics[f"kendall_tau.{r.model.model}"] = h.kendall_tau
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=output_dir,
        summary=summary,
        tables={
            "fidelity-curves": _curve_rows(results),
            "fidelity-divergence": _divergence_rows(results),
            "fidelity-agreement": _agreement_rows(results),
            "fidelity-ranks": _rank_rows(results),
        },
        images=images,
    )
