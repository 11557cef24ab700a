"""Evaluation of every checkpoint of the run, AgentWorldBench-style (SPEC.md, "Evaluation"; issue 12).

Read top to bottom, `run` does:
1. the eval set: the eval pool's target turns (the split's first, last and up to three middle turns
   per trajectory), a seeded choice under `evaluate.max_queries`, each with its kept history (SFT's
   queries); or, with `--data`, the items of benchmark files read as given by a reader
   (pipeline/evaluation/benchmark.py: the format adapters, AgentWorldBench rows included; the turns
   the data designates, each row's own system prompt, the whole history unless
   `evaluate.benchmark.max_history_chars` cuts it), with no ingest, filter, split or re-chosen target and
   nothing written to the workspace's store. Which targets are seen in training (their (action,
   observation) a kept turn of the workspace's cpt, sft or rl pool; pipeline/evaluation/contamination.py).
   Its fingerprint hashes the queries' content, how they are asked (backend, history, sampling, lengths),
   how they are measured (the code) and the training pools;
2. the models: by default the base model and the newest registered checkpoint of each training stage
   (cpt, sft, rl), or the folders given by `--checkpoint`; then the retrieval baseline (SFT's
   nearest-neighbour generator over the cpt pool). Each is asked and teacher-forced in the format of the
   stage that trained it (pipeline/evaluation/prompting.py: CPT's template, SFT template 0, RL's template);
3. per model, unless an evaluation with the same checkpoint, eval-set and judge fingerprints has
   completed (then it is reused, not recomputed): every prediction through the LLM client (local
   transformers or an OpenAI-compatible endpoint; each answer cached as it arrives), then, a batch of
   `evaluate.batch_queries` at a time, the judge's scores, the judge-free metrics and the
   teacher-forced cross-entropy, committed as rows of `eval_predictions`; a rerun after a kill
   computes only the missing rows. Then the per-domain aggregates (`eval_results`);
4. the table (every model side by side, per domain and overall: sample-weighted and the macro mean
   over domains, each labelled; the score also without the targets seen in training; every mean with its
   95% bootstrap interval over targets, and every model compared, paired on the same targets, with the
   model it started from, with base and with the retrieval baseline: pipeline/evaluation/comparison.py,
   issue 28), the rank correlations between the judge's score and each judge-free metric per domain
   (over the judged rows: parsed answers with a valid judgement), a PNG, and `report.json`, under
   `runs/evaluate/<digest of the evaluations>`.

Scoring, one rule for every model (issue 17, item 10). The judge's 1-5 scores map onto
AgentWorldBench's 0-100 as (raw - 1) / 4 x 100, per criterion and for their mean. The judge and the
judge-free metrics score the observation an answer yields; a thinking answer that does not parse (no
closed `<think>` block) yields none, and is scored as the empty observation, just as a non-thinking
answer of whitespace is: the format is not a floor inside the score, it is the `parse_rate` column.
A generation that failed after its retries is an endpoint failure, not the model's: it is counted and
left out of every mean (and too many fail the stage, `predictor.max_failed_fraction`). An invalid judge
answer is counted and left out of the judge's means (it is the judge's failure, not the model's).
With `evaluate.exclude_empty_generations` (the agentworldbench preset), an answer of nothing but
whitespace is counted (`empty`) and left out of every mean, as AgentWorldBench drops empty generations.
"""

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.config.evaluate import CHECKPOINT_PLACEHOLDER
from pipeline.errors import UserFixableError
from pipeline.evaluation.benchmark import BenchmarkItem, read_benchmark
from pipeline.evaluation.contamination import TRAINING_POOLS, seen_in_training
from pipeline.evaluation.metrics import agentworldbench_sql, spearman
from pipeline.evaluation.prompting import (
    NON_THINKING,
    RETRIEVAL,
    THINKING,
    answer_prefix,
    extract_observation,
    query_messages,
    system_prompt,
)
from pipeline.evaluation.report import EVAL_POOL, TABLE_COLUMNS, judge_caption, judge_name, table_rows, with_interval
from pipeline.evaluation.scoring import EMPTY_GENERATION, Prediction, Scorer
from pipeline.orchestration.faults import maybe_fail
from pipeline.orchestration.fingerprint import code_version
from pipeline.progress import progress_bar
from pipeline.sft.judging import CRITERIA
from pipeline.sft.queries import Query, choose_targets, content_key, distinct_queries
from pipeline.sft.sampling import digest
from pipeline.stage import StageResult
from pipeline.store.prerequisites import require_ingested
from pipeline.store.snapshot import export_snapshot, pool_size, pools_fingerprint

STAGE = "evaluate"
TRAINING_STAGES = ("cpt", "sft", "rl")
REPORT_FILE = "report.json"
PLOT_FILE = "evaluation.png"
# Judge-free metrics correlated with the judge's score, per row: (name, column or expression).
CORRELATED = (
    ("observation_ce", "ce_sum / nullif(ce_tokens, 0)"),
    ("similarity", "similarity"),
    ("semantic_match", "semantic_match::INTEGER"),
    ("rouge_l", "rouge_l"),
    ("exact_match", "exact_match::INTEGER"),
    ("json_valid", "json_valid::INTEGER"),
)


class EvaluationInputError(UserFixableError, ValueError):
    """A user-fixable problem with what was asked: no checkpoint, an unknown path, an empty eval set."""


@dataclass(frozen=True, slots=True)
class EvalSet:
    name: str
    queries: list[Query]
    fingerprint: str
    seen: frozenset[str]  # query ids whose (action, observation) is a kept turn of a training pool
    items: dict[str, BenchmarkItem]  # benchmark items by query id (`--data`); empty for the eval pool
    counts: dict[str, int]  # what reading the benchmark files found (`--data`)

    def system_prompt(self, query: Query) -> str | None:
        """The item's own system prompt, when the data carries one."""
        item = self.items.get(query.query_id)
        return item.system_prompt if item else None

    def marker(self, query: Query) -> str | None:
        item = self.items.get(query.query_id)
        return item.response_marker if item else None


@dataclass(frozen=True, slots=True)
class EvaluatedModel:
    checkpoint_id: str
    model: str  # the table's row name
    stage: str  # base, cpt, sft, rl, external, baseline
    path: str | None  # folder (or served name); None for the baseline
    prompt_format: str
    fingerprint: str

    def evaluation_id(self, eval_set: EvalSet, judge_fingerprint: str) -> str:
        return digest("evaluation", self.fingerprint, eval_set.fingerprint, judge_fingerprint)


# -- 1. the eval set ------------------------------------------------------------------------------
def _eval_targets(store) -> list[tuple[str, int]]:
    rows = store.execute(
        "SELECT t.trajectory_id, t.turn_index FROM targets t JOIN splits s USING (trajectory_id) "
        "WHERE t.pool = 'eval' AND s.pool = 'eval' ORDER BY 1, 2"
    ).fetchall()
    return [(trajectory_id, turn_index) for trajectory_id, turn_index in rows]


def _query_digest(query: Query) -> str:
    """What the model is shown and scored against (not the history's scores, which only CPT uses)."""
    return hashlib.sha256(json.dumps((query.query_id, content_key(query))).encode()).hexdigest()


def _eval_set_fingerprint(config, store, queries: list[Query], items: dict[str, BenchmarkItem]) -> str:
    """The queries' content (a benchmark item's own system prompt and marker included), how they are
    asked, how they are measured; and the training pools, which decide which targets count as seen."""
    evaluate = config.evaluate
    predictor = evaluate.predictor
    asked = (
        predictor.backend,
        predictor.temperature,
        predictor.top_p,
        predictor.max_tokens,
        predictor.seed,
        evaluate.max_history_chars,
        evaluate.benchmark.max_history_chars,
    )
    measured = (
        evaluate.teacher_forcing,
        evaluate.max_length,
        evaluate.semantic_match_threshold,
        evaluate.exclude_empty_generations,
        code_version(STAGE),
        pools_fingerprint(store, TRAINING_POOLS),
    )
    own = sorted((query_id, item.system_prompt, item.response_marker) for query_id, item in items.items())
    return digest("eval-set", [_query_digest(q) for q in queries], own, asked, measured)


def _pool_queries(config, store, snapshot_dir: Path) -> tuple[list[Query], int]:
    """`max_queries` distinct queries of the eval pool in seeded rank order, and the repeats passed over."""
    evaluate = config.evaluate
    ranked = choose_targets(_eval_targets(store), None, evaluate.seed)
    return distinct_queries(snapshot_dir, "eval", ranked, evaluate.max_queries, evaluate.max_history_chars)


def _benchmark_items(config, data: list[str]) -> tuple[list[BenchmarkItem], dict[str, int], str]:
    """The items of benchmark files, read as given (pipeline/evaluation/benchmark.py): no ingest, no
    filters, no pools, no re-chosen targets; every item scored unless `benchmark.max_items_per_path` takes a
    seeded share of each path (`max_queries` is the eval pool's budget)."""
    benchmark = config.evaluate.benchmark
    read = read_benchmark(
        data, benchmark.target_field, benchmark.max_history_chars, benchmark.max_items_per_path, config.evaluate.seed
    )
    counts = {
        "records_read": read.records_read,
        "records_failed": read.records_failed,
        "duplicates": read.duplicates,
        "items_read": len(read.items) + read.capped + read.repeats,
        "items": len(read.items),
        "repeats": read.repeats,
        "targets_designated": read.designated,
        "targets_every_turn": read.every_turn,
    }
    budget = (
        f"; {len(read.items)} of {len(read.items) + read.capped + read.repeats} kept, at most {benchmark.max_items_per_path} a "
        f"path (seed {config.evaluate.seed})"
        if benchmark.max_items_per_path is not None
        else ""
    )
    name = (
        f"{', '.join(data)} ({read.records_read} records, {read.records_failed} failed to parse, {read.duplicates} "
        f"duplicates, {read.repeats} items repeating another's query; targets: {read.designated} designated, "
        f"{read.every_turn} of trajectories designating none"
        f"{budget})"
    )
    if not read.items:
        failures = f" (e.g. {read.failures[0]})" if read.failures else ""
        raise EvaluationInputError(
            f"no target turns to evaluate in the files {', '.join(data)}: {read.records_read} "
            f"records read, {read.records_failed} failed to parse{failures}"
        )
    return read.items, counts, name


def build_eval_set(config, store, data: list[str] | None) -> tuple[EvalSet, Path]:
    """The eval set, and the snapshot of the workspace's cpt pool (the baseline's index)."""
    snapshot_dir = config.workspace.runs_dir / STAGE / "snapshots"
    pools = pools_fingerprint(store, ("cpt", "eval"))
    snapshot = export_snapshot(store, snapshot_dir / pools.replace(":", "-"), ("cpt", "eval"))
    items: dict[str, BenchmarkItem] = {}
    counts: dict[str, int] = {}
    repeats = 0
    if data:
        read, counts, name = _benchmark_items(config, data)
        items = {item.query.query_id: item for item in read}
        queries = [item.query for item in read]
    else:
        require_ingested(store)  # an empty store's eval pool is empty because nothing was ingested: say that
        queries, repeats = _pool_queries(config, store, snapshot)
        name = EVAL_POOL
        if not queries:
            raise EvaluationInputError(
                "no target turns to evaluate in the eval pool (run `simulacra split`, with an eval share)"
            )
    seen = seen_in_training(store, queries)
    passed_over = f"; {repeats} repeating another's query passed over" if repeats else ""
    eval_set = EvalSet(
        f"{name}, {len(queries)} target turns ({len(seen)} seen in training{passed_over})",
        queries,
        _eval_set_fingerprint(config, store, queries, items),
        seen,
        items,
        counts,
    )
    return eval_set, snapshot


# -- 2. the models --------------------------------------------------------------------------------
def _is_model_folder(path: str) -> bool:
    return (Path(path) / "config.json").is_file()


def _base_model(config) -> EvaluatedModel | None:
    from pipeline.training.models import base_model_ref, ensure_base_model, model_identity

    ref = ensure_base_model(config) if config.model.base is not None else base_model_ref(config)
    if config.model.base is None and not _is_model_folder(ref):
        return None  # the tiny model is built by cpt; before that there is no base to evaluate
    identity = model_identity(ref)
    return EvaluatedModel(f"base-{identity}", "base", "base", ref, NON_THINKING, identity)


def _registered(store) -> list[dict[str, Any]]:
    rows = store.rows(
        "SELECT checkpoint_id, stage, fingerprint, path FROM checkpoints ORDER BY created_at DESC, checkpoint_id"
    )
    return [row for row in rows if _is_model_folder(row["path"])]


def _of_registered(row: dict[str, Any]) -> EvaluatedModel:
    """A registered checkpoint, asked in the answer format it was trained in (its `answer_format.json`)."""
    from pipeline.prompts.answer_format import model_format

    return EvaluatedModel(
        row["checkpoint_id"],
        row["stage"],
        row["stage"],
        row["path"],
        model_format(row["path"], row["stage"]).name,
        row["fingerprint"],
    )


def default_models(config, store) -> list[EvaluatedModel]:
    """The base model, then the newest registered checkpoint of each training stage; with
    `evaluate.checkpoints: shipped`, the one checkpoint `export` will ship instead."""
    base = _base_model(config)
    models = [base] if base is not None else []
    registered = _registered(store)
    if config.evaluate.checkpoints == "shipped":
        from pipeline.serving.export_choice import choose

        choice = choose(store)
        shipped = [
            row for row in registered if choice is not None and row["checkpoint_id"] == choice.chosen.checkpoint_id
        ]
        return models + [_of_registered(row) for row in shipped[:1]]
    for stage in TRAINING_STAGES:
        newest = next((row for row in registered if row["stage"] == stage), None)
        if newest is not None:
            models.append(_of_registered(newest))
    return models


def named_models(config, store, paths: list[str], thinking: bool) -> list[EvaluatedModel]:
    """The models given by `--checkpoint`: a registered checkpoint or the base model by its folder, or
    any other model folder (asked as a base model, or in the thinking format with `--thinking`); with
    an `openai` predictor, a name the endpoint serves."""
    from pipeline.training.models import model_identity

    registered = {str(Path(row["path"]).resolve()): row for row in _registered(store)}
    base = _base_model(config)
    models = []
    for path in paths:
        resolved = str(Path(path).expanduser().resolve())
        if resolved in registered:
            models.append(_of_registered(registered[resolved]))
        elif base is not None and Path(base.path).is_dir() and resolved == str(Path(base.path).resolve()):  # type: ignore[arg-type]  # a base has a path
            models.append(base)
        elif _is_model_folder(resolved) or config.evaluate.predictor.backend == "openai":
            from pipeline.prompts.answer_format import recorded_format

            local = _is_model_folder(resolved)
            identity = model_identity(resolved if local else path)
            label = "/".join(Path(path).parts[-2:]) or path  # `<fingerprint>/model` says more than `model`
            # A folder that records its answer format (a checkpoint, an export) is asked in it; else `--thinking`.
            recorded = recorded_format(resolved) if local else None
            fmt = recorded.name if recorded else (THINKING if thinking else NON_THINKING)
            models.append(
                EvaluatedModel(f"path-{identity}", label, "external", resolved if local else path, fmt, identity)
            )
        else:
            raise EvaluationInputError(f"--checkpoint {path}: not a model folder (no config.json there)")
    # One model named twice (`--checkpoint run/model --checkpoint run/model/`) was evaluated twice under one row name:
    # "3 models", its targets counted twice in the tables (250 of 125).
    return list({model.checkpoint_id: model for model in models}.values())


def baseline_model(config, store) -> EvaluatedModel | None:
    turns = config.evaluate.baseline_history_turns
    if turns is None or pool_size(store, "cpt") == 0:
        return None  # off, or nothing to copy from
    identity = digest("retrieval", turns, pools_fingerprint(store, ("cpt",)))
    return EvaluatedModel(f"retrieval-{identity}", "retrieval baseline", "baseline", None, RETRIEVAL, identity)


# -- 3. one evaluation ----------------------------------------------------------------------------
def _predictor_endpoint(config, model: EvaluatedModel):
    predictor = config.evaluate.predictor
    if predictor.backend == "transformers":
        return predictor.model_copy(update={"model": model.path})
    return predictor.model_copy(update={"model": predictor.model.replace(CHECKPOINT_PLACEHOLDER, model.path)})


def _predict(
    config, store, model: EvaluatedModel, eval_set: EvalSet, queries: list[Query], snapshot: Path
) -> list[Prediction]:
    if model.prompt_format == RETRIEVAL:
        from pipeline.sft.retrieval import RetrievalIndex

        index = RetrievalIndex(snapshot, config.evaluate.baseline_history_turns)
        return [Prediction("ok", found[0][0].observation, None, None) for found in index.neighbours(queries, 1)]
    from pipeline.llm.client import ChatRequest, open_client

    client = open_client(_predictor_endpoint(config, model), store, f"evaluate.{model.stage}")
    answers = client.complete_sync(
        [ChatRequest(query_messages(query, model.prompt_format, eval_set.system_prompt(query))) for query in queries]
    )
    client.check_failures()
    predictions = []
    for answer in answers:
        if config.evaluate.exclude_empty_generations and answer.text is not None and not answer.text.strip():
            predictions.append(Prediction(EMPTY_GENERATION, None, None, None))  # AgentWorldBench drops these unscored
            continue
        status, observation, thinking = extract_observation(answer.text, model.prompt_format)
        predictions.append(Prediction(status, observation, thinking, answer.error))
    return predictions


ROW_COLUMNS = (
    "prediction",
    "parse_status",
    "error",
    *CRITERIA,
    "judge_raw",
    "judge_valid",
    "judge_invalid_reason",
    "similarity",
    "semantic_match",
    "rouge_l",
    "exact_match",
    "json_valid",
    "exact",
    "line_agreement",
)
PREDICTION_COLUMNS = (
    "evaluation_id",
    "query_id",
    "trajectory_id",
    "turn_index",
    "domain",
    *ROW_COLUMNS,
    "ce_sum",
    "ce_tokens",
    "created_at",
    "seen_in_training",
    "history_left_out",
)


# A row whose prediction or judge request failed is the endpoint's failure: recorded, counted, and asked
# again by the next run, even when the evaluation completed with it (a few failures do not fail the stage).
# An invalid judgement too: the judge's answers are checked as they arrive (pipeline/evaluation/tagged_judge.py
# `verdict_rejection`), so one is a row stored before they were, asked again rather than reused.
FAILED_ROW = "(parse_status = 'generation_failed' OR judge_invalid_reason IS NOT NULL)"


def _done_queries(store, evaluation_id: str) -> set[str]:
    rows = store.execute(
        f"SELECT query_id FROM eval_predictions WHERE evaluation_id = ? AND NOT {FAILED_ROW}", [evaluation_id]
    ).fetchall()
    return {row[0] for row in rows}


def _teacher_forcing(config, model: EvaluatedModel):
    evaluate = config.evaluate
    if not evaluate.teacher_forcing or model.path is None or not _is_model_folder(model.path):
        return None
    from pipeline.evaluation.cross_entropy import TeacherForcing

    return TeacherForcing(model.path, evaluate.max_length, evaluate.predictor.batch_size, evaluate.predictor.device)


def _cross_entropies(
    forcing, model: EvaluatedModel, eval_set: EvalSet, queries: list[Query], predictions: list[Prediction]
):
    if forcing is None:
        return [None] * len(queries)
    from pipeline.evaluation.cross_entropy import teacher_forced_sequence

    sequences = []
    for query, prediction in zip(queries, predictions):
        prefix = answer_prefix(model.prompt_format, prediction.thinking)
        system = eval_set.system_prompt(query) or system_prompt(query, model.prompt_format)
        sequences.append(None if prefix is None else teacher_forced_sequence(forcing.builder, system, query, prefix))
    return forcing.losses(sequences)


def _register(store, model: EvaluatedModel, eval_set: EvalSet, scorer: Scorer, evaluation_id: str) -> None:
    with store.transaction() as tx:
        tx.execute(
            "INSERT OR IGNORE INTO evaluations VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, false, now(), NULL)",
            [
                evaluation_id,
                model.checkpoint_id,
                model.model,
                model.stage,
                model.path,
                model.prompt_format,
                model.fingerprint,
                eval_set.name,
                eval_set.fingerprint,
                scorer.name,
                scorer.fingerprint,
                len(eval_set.queries),
            ],
        )


def _aggregate(store, evaluation_id: str) -> None:
    criteria = ", ".join(f"avg({agentworldbench_sql(name)})" for name in CRITERIA)
    with store.transaction() as tx:
        tx.execute("DELETE FROM eval_results WHERE evaluation_id = ?", [evaluation_id])
        tx.execute(
            f"""INSERT INTO eval_results (evaluation_id, domain, queries, judged, score, {", ".join(CRITERIA)}, unparsed, failed,
                       judge_invalid, observation_ce, perplexity, semantic_match, rouge_l, exact_match, json_valid,
                       json_references, parsed, ce_rows, seen, score_unseen, empty, exact, line_agreement)
                SELECT ?, coalesce(domain, 'all'), count(*), count(judge_raw), avg({agentworldbench_sql("judge_raw")}), {criteria},
                       count(*) FILTER (WHERE parse_status NOT IN ('ok', 'generation_failed', 'empty_generation')),
                       count(*) FILTER (WHERE parse_status = 'generation_failed'),
                       count(*) FILTER (WHERE NOT judge_valid),
                       sum(ce_sum) / nullif(sum(ce_tokens), 0), exp(sum(ce_sum) / nullif(sum(ce_tokens), 0)),
                       avg(semantic_match::INTEGER), avg(rouge_l), avg(exact_match::INTEGER), avg(json_valid::INTEGER),
                       count(json_valid), count(*) FILTER (WHERE parse_status = 'ok'), count(ce_tokens),
                       count(*) FILTER (WHERE seen_in_training),
                       avg({agentworldbench_sql("judge_raw")}) FILTER (WHERE NOT seen_in_training),
                       count(*) FILTER (WHERE parse_status = 'empty_generation'), avg(exact::INTEGER), avg(line_agreement)
                FROM eval_predictions WHERE evaluation_id = ? GROUP BY ROLLUP (domain)""",
            [evaluation_id, evaluation_id],
        )
        # AgentWorldBench's Overall weighs every domain alike (issue 18): the macro mean of the domains'
        # scores, on the `all` row beside `score`, which weighs every scored row alike.
        tx.execute(
            """UPDATE eval_results SET score_macro = m.score, domains = m.domains
               FROM (SELECT avg(score) AS score, count(score) AS domains FROM eval_results
                     WHERE evaluation_id = ? AND domain <> 'all') m
               WHERE evaluation_id = ? AND domain = 'all'""",
            [evaluation_id, evaluation_id],
        )
        tx.execute(
            "UPDATE evaluations SET completed = true, completed_at = now() WHERE evaluation_id = ?", [evaluation_id]
        )


def evaluate_model(config, store, model: EvaluatedModel, eval_set: EvalSet, scorer: Scorer, snapshot: Path) -> bool:
    """Evaluate one model (or finish its evaluation); False when it had completed already."""
    evaluation_id = model.evaluation_id(eval_set, scorer.fingerprint)
    if store.scalar(
        f"""SELECT completed AND NOT EXISTS (SELECT 1 FROM eval_predictions WHERE evaluation_id = ? AND {FAILED_ROW})
            FROM evaluations WHERE evaluation_id = ?""",
        [evaluation_id, evaluation_id],
    ):
        return False
    _register(store, model, eval_set, scorer, evaluation_id)
    done = _done_queries(store, evaluation_id)
    todo = [query for query in eval_set.queries if query.query_id not in done]
    if todo:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar per model load; the stage reports its own progress
        predictions = _predict(config, store, model, eval_set, todo, snapshot)
        forcing = _teacher_forcing(config, model)
        batch_size = config.evaluate.batch_queries
        with progress_bar(f"evaluate {model.model}: queries judged and measured", total=len(todo)) as advance:
            for start in range(0, len(todo), batch_size):
                queries, batch = todo[start : start + batch_size], predictions[start : start + batch_size]
                rows = scorer.rows(queries, batch, [eval_set.marker(query) for query in queries])
                losses = _cross_entropies(forcing, model, eval_set, queries, batch)
                now = datetime.now()
                values = [
                    [
                        evaluation_id,
                        query.query_id,
                        query.trajectory_id,
                        query.turn_index,
                        query.domain,
                        *(row.get(column) for column in ROW_COLUMNS),
                        *(loss if loss else (None, None)),
                        now,
                        query.query_id in eval_set.seen,
                        query.history_left_out,
                    ]
                    for query, row, loss in zip(queries, rows, losses)
                ]
                with store.transaction() as tx:
                    tx.executemany(
                        f"INSERT OR REPLACE INTO eval_predictions ({', '.join(PREDICTION_COLUMNS)}) "
                        f"VALUES ({', '.join('?' * len(PREDICTION_COLUMNS))})",
                        values,
                    )
                advance(len(queries))
                # `orchestration.fail_stage: evaluate` fails once, after the first batch is committed.
                maybe_fail(config, STAGE, f"after {start + len(queries)} rows of {model.model}")
    _aggregate(store, evaluation_id)
    return True


# -- 4. the table ---------------------------------------------------------------------------------
def correlations(store, evaluation_ids: list[str]) -> list[dict[str, Any]]:
    """Spearman's rho between the judge's score and each judge-free metric, per domain and over all
    domains, over the judged rows of the given evaluations: answers that parsed in their model's
    format and got a valid judgement (`rows` counts them). An unparsed answer is scored as the empty
    observation, the same text for every model, so pooling those rows would rank the parse rate, not
    the judge (issue 17, item 12: CE's rho was +0.28 with them, -0.20 without). All models are pooled:
    the spread between a weak and a strong model is what a judge must rank."""
    metrics = ", ".join(f"{expression} AS {name}" for name, expression in CORRELATED)
    rows = store.rows(
        f"SELECT domain, judge_raw, {metrics} FROM eval_predictions "
        "WHERE evaluation_id IN (SELECT unnest(?::VARCHAR[])) AND judge_raw IS NOT NULL AND parse_status = 'ok'",
        [evaluation_ids],
    )
    result = []
    for domain in sorted({row["domain"] for row in rows}) + ["all"]:
        chosen = [row for row in rows if domain in ("all", row["domain"])]
        entry: dict[str, Any] = {"domain": domain, "rows": len(chosen)}
        for name, _ in CORRELATED:
            pairs = [(row["judge_raw"], row[name]) for row in chosen if row[name] is not None]
            entry[name] = spearman([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None
        result.append(entry)
    return result


def _error_bar(row: dict[str, Any], metric: str) -> tuple[float, float]:
    """How far the row's 95% interval reaches below and above its bar (issue 28); nothing where it has none."""
    value, low, high = row.get(metric), row.get(f"{metric}_low"), row.get(f"{metric}_high")
    if value is None or low is None or high is None:
        return 0.0, 0.0
    return max(0.0, value - low), max(0.0, high - value)


def _plot(rows: list[dict[str, Any]], judge: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(row["model"] for row in rows))
    domains = sorted({row["domain"] for row in rows if row["domain"] != "all"}) + ["all"]
    by_key = {(row["model"], row["domain"]): row for row in rows}
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(models))
    for panel, (metric, title) in zip(
        axes,
        (
            ("score", f"judge score, 0-100 ({judge_name(judge)}), 95% intervals"),
            ("rouge_l", "ROUGE-L F1 (judge-free), 95% intervals"),
        ),
    ):
        for k, model in enumerate(models):
            shown = [by_key.get((model, d)) or {} for d in domains]
            below, above = zip(*(_error_bar(row, metric) for row in shown))
            panel.bar(
                [x + k * width for x in range(len(domains))],
                [row.get(metric) or 0.0 for row in shown],
                width,
                yerr=[below, above],
                capsize=2,
                label=model,
            )
        panel.set_xticks([x + width * (len(models) - 1) / 2 for x in range(len(domains))], domains)
        panel.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    figure.suptitle("World-model evaluation: every checkpoint against the base and the retrieval baseline")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# What each overall score is, for the report: both are given, each labelled (issue 18).
SCORE_LABELS = {
    "score": "sample-weighted: the mean over every scored row (all domains pooled, as eval.py's `score` command)",
    "score_macro": "macro: the mean of the domains' scores, every domain weighing alike (on the `all` row)",
    "score_unseen": "sample-weighted, without the targets seen in training",
}
INTERVALS_LABEL = (
    "<measure>_low, <measure>_high: the 95% percentile-bootstrap interval over the targets (2000 resamples, "
    "seeded; score_macro resampled within each domain); <measure>_pm: half its width, a stderr-like spread; "
    "observation_ce's interval is of the mean per-target CE, its value token-weighted"
)
COMPARISONS_LABEL = (
    "paired on the targets both models scored: difference = model - compared_with, its mean and 95% "
    "bootstrap interval; relation: the model it started from (base -> cpt -> sft -> rl), base (for the last "
    "trained stage), or the retrieval baseline; verdict improved/WORSE only where the interval excludes "
    "zero, observation_ce lower is better"
)


def _score(row: dict[str, Any], column: str) -> str:
    """`41.1 [35.2, 47.0]`: the score with its 95% interval over targets (issue 28)."""
    return with_interval(row, column) or ("-" if row[column] is None else f"{row[column]:.1f}")


# The comparisons a summary states: each trained model's gain over the model it started from, and the last
# one's over base (`relation` of pipeline/evaluation/comparison.py's pairs).
GAINS = ("started from", "base")


def _gains(comparisons: list[dict[str, Any]]) -> str:
    """`sft vs cpt no measurable change +1.0 [-2.1, +4.3], ...`: the overall score's paired differences, in
    words that never call a difference whose interval crosses zero a change."""
    return ", ".join(
        f"{c['model']} vs {c['compared_with']} {c['verdict']} {c['change']}"
        for c in comparisons
        if c["relation"] in GAINS and c["measure"] == "score" and c["domain"] == "all"
    )


def _summary(
    rows: list[dict[str, Any]],
    comparisons: list[dict[str, Any]],
    eval_set: EvalSet,
    judge: str,
    reused: int,
    total: int,
) -> str:
    overall = ", ".join(
        f"{row['model']} {_score(row, 'score')} / {_score(row, 'score_macro')}"
        for row in rows
        if row["domain"] == "all"
    )
    gains = _gains(comparisons)
    gained = f"; score gains, paired on the targets both scored (95% interval): {gains}" if gains else ""
    return (
        f"{total} models on {eval_set.name}, {judge_name(judge)}; overall score (0-100, sample-weighted / macro "
        f"over domains, 95% intervals over targets): {overall}{gained} ({reused} reused, not recomputed)"
    )


def _check_budget(config, models: list[EvaluatedModel], eval_set: EvalSet) -> None:
    """`predictor.max_tokens` must hold the p95 target observation and, when a thinking model is among
    those asked, the thinking its SFT samples taught (issue 16.4), in the models' tokenizer (the first
    local folder's: checkpoints of one pipeline share it). Served models without a folder are not checked."""
    from pipeline.evaluation.prompting import THINKING_FORMATS
    from pipeline.training.budgets import answer_tokens, percentile_95, require_budget, thinking_allowance
    from pipeline.training.models import load_tokenizer

    local = [model for model in models if model.path is not None and _is_model_folder(model.path)]
    if not local or not eval_set.queries:
        return
    thinking = max(
        (thinking_allowance(model.path) for model in local if model.prompt_format in THINKING_FORMATS),  # type: ignore[arg-type]  # local: a path
        default=0,
    )
    tokenizer = load_tokenizer(local[0].path, config.model.trust_remote_code)  # type: ignore[arg-type]  # local: a path
    needed = percentile_95(answer_tokens(tokenizer, [query.reference for query in eval_set.queries])) + thinking
    what = "the target observations" + (" plus the thinking SFT taught" if thinking else "")
    require_budget("evaluate.predictor.max_tokens", config.evaluate.predictor.max_tokens, needed, what)


def run(
    config, store, checkpoints: list[str] | None = None, data: list[str] | None = None, thinking: bool = False
) -> StageResult:
    eval_set, snapshot = build_eval_set(config, store, data)
    models = named_models(config, store, checkpoints, thinking) if checkpoints else default_models(config, store)
    if not models:
        raise EvaluationInputError("no checkpoint to evaluate: run `simulacra cpt` first, or give --checkpoint PATH")
    if (
        config.evaluate.predictor.backend == "openai"
        and len(models) > 1
        and CHECKPOINT_PLACEHOLDER not in config.evaluate.predictor.model
    ):
        raise EvaluationInputError(
            f"evaluate.predictor.model {config.evaluate.predictor.model!r} names one served model for {len(models)} "
            f"checkpoints: use {CHECKPOINT_PLACEHOLDER} in it, or give one --checkpoint"
        )
    _check_budget(config, models, eval_set)
    baseline = baseline_model(config, store)
    models += [baseline] if baseline is not None else []
    scorer = Scorer(config.evaluate, store)
    ids, reused = [], 0
    for model in models:
        ids.append(model.evaluation_id(eval_set, scorer.fingerprint))
        if not evaluate_model(config, store, model, eval_set, scorer, snapshot):
            reused += 1
    if scorer.client is not None:
        scorer.client.check_failures()
    rows = table_rows(store, ids)
    compared = [comparison for row in rows for comparison in row["comparisons"]]  # each row carries its own
    correlated = correlations(store, ids)
    output_dir = config.workspace.runs_dir / STAGE / digest("report", sorted(ids))
    plot = _plot(rows, scorer.name, output_dir / PLOT_FILE)
    (output_dir / REPORT_FILE).write_text(
        json.dumps(
            {
                "eval_set": eval_set.name,
                "eval_set_fingerprint": eval_set.fingerprint,
                "benchmark": eval_set.counts,
                "judge": scorer.name,
                "judge_fingerprint": scorer.fingerprint,
                "judge_caption": judge_caption(scorer.name),
                "scores": SCORE_LABELS,
                "intervals": INTERVALS_LABEL,
                "comparisons_are": COMPARISONS_LABEL,
                "evaluations": ids,
                "table": [{k: v for k, v in row.items() if k != "comparisons"} for row in rows],
                "comparisons": compared,
                "correlations": correlated,
                "correlations_over": "judged rows: answers that parsed in their model's format, with a valid judgement",
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    metrics = {
        "models": len(models),
        "reused": reused,
        "queries": len(eval_set.queries),
        "eval_set": eval_set.name,
        "eval_set_fingerprint": eval_set.fingerprint,
        "judge": scorer.name,
        "judge_fingerprint": scorer.fingerprint,
        "report": str(output_dir / REPORT_FILE),
        **{f"score.{row['model']}": row["score"] for row in rows if row["domain"] == "all"},
        **{f"score_macro.{row['model']}": row["score_macro"] for row in rows if row["domain"] == "all"},
        **{
            f"score_{bound}.{row['model']}": row[f"score_{bound}"]
            for row in rows
            if row["domain"] == "all"
            for bound in ("low", "high")
        },
        **{f"benchmark.{name}": count for name, count in eval_set.counts.items()},
    }
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=output_dir,
        summary=_summary(rows, compared, eval_set, scorer.name, reused, len(models)),
        tables={
            "evaluate-table": [{c: row[c] for c in TABLE_COLUMNS} for row in rows],
            "evaluate-comparisons": compared,
            "evaluate-correlations": correlated,
        },
        images={"evaluate-scores": plot},
    )
