"""Stage 2, rejection-sampled SFT (SPEC.md; issue 10): judged thinking candidates, then training on the winners.

Three steps, as CPT's (flows/gpu_stage.py runs the middle one on a GPU worker when
`orchestration.gpu_deployment` is set; `run` runs all three in one process):
1. `prepare`, on the data side, with the store: the model SFT starts from (the registered CPT
   checkpoint unless `sft.base_model`), a Parquet snapshot of the cpt, sft and eval pools, the
   fingerprint; then rejection sampling (pipeline/sft/sampling.py) over a seeded choice of the sft
   pool's target turns (`sft.max_queries`; a turn too long for `sft.max_length` even with the
   shortest template and no history is passed over before anything is generated for it): K
   candidates, strictly parsed, judged against the real observation, the ones that pass `min_score`
   and the thinking check compared pairwise round robin in both orders (by the LLM judge; the
   similarity judge's ranking decides alone), a keep/discard decision per query, every row
   committed as it is produced, so a killed run resumes where it was; then the training
   sequences of the kept queries (pipeline/sft/samples.py: one of ten system templates per sample,
   labels on the assistant output only) and the held-out sequences (the eval pool in CPT's format
   and windows, so the cross-entropy is comparable with CPT's);
2. `train`, from files only: the held-out queries predicted by the model before SFT, training
   through the shared packed Trainer path (pipeline/training/trainer.py), resuming from its last
   checkpoint, the held-out queries predicted again by the trained model;
3. `record`, on the data side: the judge scores both sets of held-out predictions, which then join
   the store's answer cache (evaluation asks the CPT and SFT checkpoints the same queries); the
   checkpoint is registered; `metrics.json` marks the run complete.

The target of a kept sample ends with the winner's thinking followed by the *real* observation,
not the winner's prediction: the judge admits a prediction that differs from the environment where
the rubric only asks for plausibility (a PID, a timestamp, an unseen file's contents); training on
it would teach the generator's guesses as facts, where the real observation is the environment's
own answer. The thinking stays the winner's, the reasoning the data lacks, and it must lead to the
observation it is trained before: SPEC's "If the best falls below a minimum score the query is
discarded" read for a target of thinking + real observation. So a candidate competes only when its
own prediction agrees with the real observation on deterministic content (`sft.min_content_agreement`
for the similarity judge, the judge's factuality `sft.min_factuality` for the LLM judge), besides
`min_score`; a query with no such candidate is discarded as `thinking_inconsistent` (issue 17, item 7:
in the demo 23 of 28 kept winners predicted another record than the one trained on).
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import SimulacraConfig
from pipeline.errors import UserFixableError
from pipeline.llm.cache import adopt_answers
from pipeline.orchestration.faults import maybe_fail
from pipeline.progress import progress_bar
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.sft.base_model import sft_base_ref
from pipeline.sft.candidates import parse_candidate, render_thinking_output
from pipeline.sft.queries import Query, chat_messages, choose_targets, load_queries
from pipeline.stage import StageResult
from pipeline.training.budgets import THINKING_P95, answer_tokens, percentile_95, require_budget
from pipeline.training.models import load_tokenizer
from pipeline.training.runs import HELDOUT_CACHE, RunPlan, claim_run_folder, complete_run, heldout_metrics
from pipeline.store.atomic_files import write_text_atomic
from pipeline.store.snapshot import export_snapshot, pools_fingerprint, read_pool, target_turns

STAGE = "sft"
POOLS = ("cpt", "sft", "eval")
METRICS_FILE = "metrics.json"
QUERIES_FILE = "queries.json"  # the sft queries sampled and the held-out eval queries, as (trajectory, turn)
SAMPLING_FILE = "sampling.json"
TRAINED_FILE = "trained.json"
STATS_FILE = "stats.json"
SCORES_PLOT = "score_distribution.png"


@dataclass(slots=True)
class Plan(RunPlan):
    """What training needs, decided on the data side; also what `record` needs to finish there."""

    pools: str = ""
    # The resolved config: `record` rebuilds the judge from it (a GPU dispatch hands it only the plan).
    config: dict[str, Any] = field(default_factory=dict)


def _plan(config, store) -> Plan:
    base_ref = sft_base_ref(config, store)
    if not target_turns(store, "sft"):
        raise UserFixableError("pool 'sft' has no target turns: run `simulacra split` first (or give the sft pool a share)")
    pools = pools_fingerprint(store, POOLS)
    snapshot = export_snapshot(store, config.workspace.runs_dir / STAGE / "snapshots" / pools.replace(":", "-"), POOLS)
    output_dir, fingerprint = claim_run_folder(config, store, STAGE, config.sft.output_dir)
    done = (output_dir / METRICS_FILE).is_file()
    return Plan(output_dir, snapshot, fingerprint, base_ref, done, config.workspace.keep_resume_checkpoints, pools=pools,
                config=config.model_dump(mode="json"))


# -- 2. sampling ----------------------------------------------------------------------------------
def _sample(config, store, plan: Plan, queries: list[Query], judge, judge_label: str):
    from pipeline.sft.generators import build_generators
    from pipeline.sft.sampling import RejectionSampler

    sft = config.sft
    generators, clients = build_generators(sft.generators, store, plan.snapshot_dir, plan.base_ref, plan.pools)

    def after_batch(done: int) -> None:
        # `orchestration.fail_stage: sft` fails once, after the first batch is committed, so the rerun
        # must continue from the store.
        maybe_fail(config, STAGE, f"after {done} queries were sampled and judged")

    sampler = RejectionSampler(
        store, generators, judge, judge_label, sft.min_score, sft.min_agreement, sft.seed, sft.batch_queries, after_batch
    )
    with progress_bar("sft queries sampled and judged", total=len(queries)) as advance:
        tally = sampler.run(queries, advance)
    for client in clients:
        client.check_failures()
    return sampler, tally


def _reasons(selections: list[dict[str, Any]]) -> str:
    counts = Counter(row["reason"] for row in selections)
    return ", ".join(f"{reason} {n}" for reason, n in counts.most_common()) or "none decided"


def _thinking_check(sft) -> str:
    field = "sft.min_factuality" if sft.judge.kind == "llm" else "sft.min_content_agreement"
    return f"{field} {sft.min_agreement:g}" if sft.min_agreement is not None else f"{field} off"


def _query_ids(queries: list[Query]) -> list[str]:
    return [query.query_id for query in queries]


def _selections(store, selection: str, queries: list[Query]) -> list[dict[str, Any]]:
    return store.rows(
        "SELECT s.*, c.thinking FROM sft_samples s LEFT JOIN sft_candidates c ON c.candidate_id = s.winner "
        "WHERE s.selection = ? AND s.query_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY s.query_id",
        [selection, _query_ids(queries)],
    )


def retention_rows(store, selection: str, queries: list[Query]) -> list[dict[str, Any]]:
    """Per domain (and overall): queries, kept, retention, mean winning score."""
    rows = store.rows(
        """SELECT coalesce(domain, 'all') AS domain, count(*) AS queries, count(*) FILTER (WHERE kept) AS kept,
                  round(count(*) FILTER (WHERE kept) / count(*), 4) AS retention, round(avg(score), 3) AS mean_winner_score
           FROM sft_samples WHERE selection = ? AND query_id IN (SELECT unnest(?::VARCHAR[]))
           GROUP BY ROLLUP (domain) ORDER BY domain IS NULL, domain""",
        [selection, _query_ids(queries)],
    )
    return rows


def retention_report(store) -> list[dict[str, Any]]:
    """`simulacra stats`: retention per domain of the latest selection (generators, judge, min_score),
    over every query it has decided so far; the paper's figures for comparison are in the README."""
    rows = store.rows(
        """WITH latest AS (SELECT selection FROM sft_samples ORDER BY created_at DESC LIMIT 1)
           SELECT coalesce(domain, 'all') AS domain, count(*) AS queries, count(*) FILTER (WHERE kept) AS kept,
                  round(count(*) FILTER (WHERE kept) / count(*), 4) AS retention,
                  round(avg(score), 3) AS mean_winner_score, any_value(selection) AS selection
           FROM sft_samples WHERE selection = (SELECT selection FROM latest)
           GROUP BY ROLLUP (domain) ORDER BY domain IS NULL, domain"""
    )
    return rows if rows and rows[-1]["queries"] else []  # ROLLUP's total row alone: nothing sampled yet


def _breakdowns(store, selection: str, judge_label: str, queries: list[Query]) -> dict[str, list[dict[str, Any]]]:
    ids = _query_ids(queries)
    return {
        "sft-retention": retention_rows(store, selection, queries),
        "sft-decisions": store.rows(
            "SELECT reason, coalesce(decided_by, '-') AS decided_by, count(*) AS queries FROM sft_samples "
            "WHERE selection = ? AND query_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL ORDER BY queries DESC, reason",
            [selection, ids],
        ),
        "sft-candidates": store.rows(
            "SELECT generator, parse_status, count(*) AS candidates, sum(prompt_tokens) AS prompt_tokens, "
            "sum(completion_tokens) AS completion_tokens FROM sft_candidates "
            "WHERE query_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL ORDER BY generator, parse_status",
            [ids],
        ),
        "sft-judgements": store.rows(
            "SELECT kind, valid, coalesce(invalid_reason, '-') AS invalid_reason, count(*) AS judgements, "
            "round(avg(score), 3) AS mean_score FROM judgements WHERE judge = ? AND query_id IN (SELECT unnest(?::VARCHAR[])) "
            "GROUP BY ALL ORDER BY kind, valid DESC, judgements DESC",
            [judge_label, ids],
        ),
    }


def _plot_scores(store, plan: Plan, judge_label: str, selection: str, queries: list[Query], min_score: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = _query_ids(queries)
    candidates = [row[0] for row in store.execute(
        "SELECT score FROM judgements WHERE kind = 'pointwise' AND judge = ? AND query_id IN (SELECT unnest(?::VARCHAR[]))",
        [judge_label, ids]).fetchall()]
    winners = [row[0] for row in store.execute(
        "SELECT score FROM sft_samples WHERE selection = ? AND score IS NOT NULL AND query_id IN (SELECT unnest(?::VARCHAR[]))",
        [selection, ids]).fetchall()]
    figure, axes = plt.subplots(figsize=(7, 4))
    bins = [edge / 4 for edge in range(0, 21)]
    axes.hist([candidates, winners], bins=bins, label=["every judged candidate", "each query's winner"])
    axes.axvline(min_score, color="black", linestyle="--", label=f"min_score {min_score:g}")
    axes.set_xlabel(f"judge score (0 = invalid answer; {judge_label.split('#')[0]})")
    axes.set_ylabel("count")
    axes.set_title("SFT rejection sampling: score distribution")
    axes.legend()
    figure.tight_layout()
    path = plan.output_dir / SCORES_PLOT
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


# -- 3. sequences ---------------------------------------------------------------------------------
def _build_sequences(config, plan: Plan, selections: list[dict[str, Any]], queries: list[Query]) -> dict[str, Any]:
    from pipeline.sft.samples import sft_sequence
    from pipeline.training.models import ensure_chatml_tokens
    from pipeline.training.sequences import SequenceBuilder, SequenceWriter

    stats_path = plan.sequences_dir / STATS_FILE
    if stats_path.is_file():
        return json.loads(stats_path.read_text())
    tokenizer = load_tokenizer(plan.base_ref, config.model.trust_remote_code)
    ensure_chatml_tokens(tokenizer)
    plan.sequences_dir.mkdir(parents=True, exist_ok=True)
    by_id = {query.query_id: query for query in queries}
    counted = Counter()
    templates = Counter()
    thinking_lengths: list[int] = []
    builder = SequenceBuilder(tokenizer, config.sft.max_length, config.sft.seed)
    with SequenceWriter(plan.sequences_dir / "train.parquet") as train:
        for row in selections:
            if not row["kept"]:
                continue
            query = by_id[row["query_id"]]
            system = TEMPLATES[row["template_id"]].render(query.domain, query.system)
            target = render_thinking_output(row["thinking"], query.reference)
            built = sft_sequence(builder, query.trajectory_id, system, query.history, query.action, target, query.turn_index)
            counted["history_turns_dropped"] += built.history_dropped
            if built.sequence is None:
                counted["samples_too_long"] += 1
                continue
            train.write(built.sequence)
            # The thinking block as taught, tags and separator included: what a held-out answer spends
            # before its observation (pipeline/training/budgets.py).
            thinking_lengths.append(len(tokenizer.encode(render_thinking_output(row["thinking"], ""), add_special_tokens=False)))
            templates[row["template_id"]] += 1
            counted["train_sequences"] += 1
            counted["train_tokens"] += len(built.sequence.input_ids)
            counted["train_label_tokens"] += sum(1 for label in built.sequence.labels if label != -100)
    # The eval pool exactly as CPT measures it (its template, windows, max_length and cap), so the
    # two stages' observation cross-entropies are on the same tokens.
    cpt_builder = SequenceBuilder(tokenizer, config.cpt.max_length, config.cpt.seed)
    with SequenceWriter(plan.sequences_dir / "eval.parquet") as held_out:
        for trajectory in read_pool(plan.snapshot_dir, "eval"):
            prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
            windows, _ = cpt_builder.trajectory_sequences(trajectory.trajectory_id, prompt, trajectory.turns, full_labels=True)
            for window in windows[: config.cpt.eval_max_sequences - counted["eval_sequences"]]:
                held_out.write(window)
                counted["eval_sequences"] += 1
            if counted["eval_sequences"] >= config.cpt.eval_max_sequences:
                break
    stats = {**{k: counted[k] for k in ("train_sequences", "train_tokens", "train_label_tokens", "samples_too_long",
                                        "history_turns_dropped", "eval_sequences")},
             THINKING_P95: percentile_95(thinking_lengths),
             "templates": {str(t): n for t, n in sorted(templates.items())}}
    stats_path.write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")  # last: marks both files complete
    return stats


# -- 4. held-out predictions (training side) and their scores (data side) -------------------------
def _heldout_messages(query: Query, thinking: bool) -> tuple[dict[str, str], ...]:
    """Each model in the format it was trained on: CPT's template (non-thinking) before SFT, the first
    SFT template (thinking) after."""
    system = TEMPLATES[0].render(query.domain, query.system) if thinking else render_cpt_system_prompt(query.domain, query.system)
    return chat_messages(query, system)


def _heldout_queries(config, plan: Plan) -> list[Query]:
    chosen = [tuple(target) for target in json.loads((plan.output_dir / QUERIES_FILE).read_text())["eval"]]
    return load_queries(plan.snapshot_dir, "eval", chosen, config.sft.max_history_chars) if chosen else []


def _heldout_predictions(config, plan: Plan, queries: list[Query], model_ref: str, thinking: bool, name: str) -> list[dict]:
    """Greedy predictions of the held-out queries by `model_ref` (the transformers backend), where
    training runs. They never touch the store: the client caches in a scratch DuckDB file of the
    run's folder, so a GPU worker can make them."""
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import ChatRequest, open_client
    from pipeline.store.database import Store

    path = plan.output_dir / f"heldout_{name}_predictions.json"
    if path.is_file():
        return json.loads(path.read_text())
    endpoint = EndpointConfig(backend="transformers", model=str(model_ref), temperature=0.0, max_tokens=config.sft.eval_max_tokens)
    with Store(plan.output_dir / HELDOUT_CACHE) as scratch:
        client = open_client(endpoint, scratch, f"sft.heldout.{name}")
        answers = client.complete_sync([ChatRequest(_heldout_messages(query, thinking)) for query in queries]) if queries else []
    predictions = [{"query_id": q.query_id, "text": a.text, "error": a.error, "thinking": thinking} for q, a in zip(queries, answers)]
    write_text_atomic(path, json.dumps(predictions, indent=2) + "\n")
    return predictions


def _heldout_score(queries: list[Query], predictions: list[dict], judge) -> dict[str, Any]:
    """Mean judge score over the held-out queries; a thinking-format prediction that does not parse,
    or a failed generation, scores 0. An empty observation is judged like any other: `mkdir x` prints
    nothing, so an empty answer can be the right one (issue 17, item 16)."""
    from pipeline.sft.judging import PointwiseItem

    if not queries:
        return {"queries": 0, "usable_predictions": 0, "mean_score": None}
    usable: list[tuple[int, str]] = []
    for index, prediction in enumerate(predictions):
        text = prediction["text"]
        if prediction["thinking"]:
            parsed = parse_candidate(text)
            text = parsed.prediction if parsed.ok else None
        if text is not None:
            usable.append((index, text))
    verdicts = judge.pointwise([PointwiseItem(queries[i], text) for i, text in usable]) if usable else []
    scores = [0.0] * len(queries)
    for (index, _), verdict in zip(usable, verdicts):
        scores[index] = verdict.score
    return {"queries": len(queries), "usable_predictions": len(usable), "mean_score": sum(scores) / len(scores)}


def _choose_queries(sft, plan: Plan, store, tokenizer) -> tuple[list[Query], int]:
    """The seeded choice of `sft.max_queries` queries among the sft pool's targets that can become a
    training sample (pipeline/sft/samples.py `can_fit`), in rank order, and how many targets were passed
    over on the way. A passed-over target would cost its candidates' generation and judging, then be
    skipped as too long; the budget goes to the next one in rank instead. The choice is still the same
    at every run, and a larger budget still takes a superset."""
    from pipeline.sft.samples import can_fit, shortest_prompt
    from pipeline.training.models import ensure_chatml_tokens
    from pipeline.training.sequences import SequenceBuilder

    ensure_chatml_tokens(tokenizer)
    builder = SequenceBuilder(tokenizer, sft.max_length, sft.seed)
    ranked = choose_targets(target_turns(store, "sft"), None, sft.seed)
    wanted = len(ranked) if sft.max_queries is None else min(sft.max_queries, len(ranked))
    chosen: list[Query] = []
    passed_over = 0
    shortest: dict[str, str] = {}  # per trajectory: its targets share the system prompt and its ten renderings
    # A chunk of the ranking at a time: a budget of 24 reads one chunk of 64 queries, not the whole pool.
    chunk = max(64, 2 * wanted)
    with progress_bar("sft queries checked against sft.max_length", total=wanted) as advance:
        for start in range(0, len(ranked), chunk):
            for query in load_queries(plan.snapshot_dir, "sft", ranked[start : start + chunk], sft.max_history_chars):
                if len(chosen) == wanted:
                    break
                if query.trajectory_id not in shortest:
                    rendered = [template.render(query.domain, query.system) for template in TEMPLATES]
                    shortest[query.trajectory_id] = shortest_prompt(builder, rendered)
                if can_fit(builder, shortest[query.trajectory_id], query.action, query.reference):
                    chosen.append(query)
                    advance(1)
                else:
                    passed_over += 1
            if len(chosen) == wanted:
                break
    return chosen, passed_over


def _check_generator_budgets(sft, tokenizer, queries: list[Query]) -> None:
    """Each model generator's `max_tokens` must at least hold the observations it predicts (with budget
    forcing the thinking has a budget of its own; a model that thinks freely needs more still)."""
    needed = percentile_95(answer_tokens(tokenizer, [query.reference for query in queries]))
    for position, generator in enumerate(sft.generators):
        if generator.kind == "endpoint":
            require_budget(f"sft.generators[{position}].endpoint.max_tokens", generator.endpoint.max_tokens, needed,
                           "the observations of the sft queries")


# -- 5. the three steps: prepare (data side), train (training side), record (data side) ------------
def prepare(config, store) -> Plan:
    """Everything that reads or writes the store: sampling and judging, then the Parquet sequences."""
    from transformers.utils import logging as hf_logging

    from pipeline.sft.generators import build_judge, judge_label

    hf_logging.disable_progress_bar()  # a weight-loading bar per model load; the stage reports its own progress
    sft = config.sft
    plan = _plan(config, store)
    if plan.done:
        return plan
    tokenizer = load_tokenizer(plan.base_ref, config.model.trust_remote_code)
    queries, unfittable = _choose_queries(sft, plan, store, tokenizer)
    if not queries:
        raise UserFixableError(
            f"none of the sft pool's {unfittable} target turns fits in sft.max_length ({sft.max_length} tokens) even "
            "with the shortest system template and no history: raise sft.max_length"
        )
    chosen = [(query.trajectory_id, query.turn_index) for query in queries]
    heldout = choose_targets(target_turns(store, "eval"), sft.eval_queries, sft.seed) if sft.eval_queries else []
    _check_generator_budgets(sft, tokenizer, queries)
    label = judge_label(sft.judge)
    judge, judge_client = build_judge(sft.judge, store)
    sampler, tally = _sample(config, store, plan, queries, judge, label)
    if judge_client is not None:
        judge_client.check_failures()  # a broken judge fails the stage before anything trains
    selections = _selections(store, sampler.selection, queries)
    kept = sum(1 for row in selections if row["kept"])
    if not kept:
        raise UserFixableError(
            f"sft kept none of {len(queries)} queries ({_reasons(selections)}): see the sft_samples table; lower "
            f"sft.min_score ({sft.min_score:g}) or the thinking check ({_thinking_check(sft)}), or use a stronger generator"
        )
    stats = _build_sequences(config, plan, selections, queries)
    if not stats["train_sequences"]:
        raise UserFixableError(
            f"none of the {kept} kept samples fits in sft.max_length ({sft.max_length} tokens) even without history: "
            "raise sft.max_length"
        )
    heldout_references = [q.reference for q in load_queries(plan.snapshot_dir, "eval", heldout, sft.max_history_chars)]
    require_budget("sft.eval_max_tokens", sft.eval_max_tokens,
                   percentile_95(answer_tokens(tokenizer, heldout_references)) + stats.get(THINKING_P95, 0),
                   "the held-out observations plus the thinking the kept samples teach")
    write_text_atomic(plan.output_dir / QUERIES_FILE, json.dumps({"sft": chosen, "eval": heldout}) + "\n")
    _plot_scores(store, plan, label, sampler.selection, queries, sft.min_score)
    sampling = {
        "queries": len(queries),
        "queries_unfittable": unfittable,
        "kept": kept,
        "retention": kept / len(queries),
        "candidates_per_query": sft.candidates_per_query,
        "candidates_generated_this_run": tally.candidates_generated,
        "judgements_this_run": tally.pointwise_judged + tally.pairwise_judged,
        "judge": label,
        "thinking_check": _thinking_check(sft),
        "selection": sampler.selection,
        **{k: v for k, v in stats.items() if not isinstance(v, dict)},
        **{f"template.{t}": n for t, n in stats["templates"].items()},
    }
    write_text_atomic(plan.output_dir / SAMPLING_FILE, json.dumps(sampling, indent=2, sort_keys=True) + "\n")
    return plan


def train(config, plan: Plan) -> None:
    """From the plan's files only (never the store): the held-out predictions of the model before SFT,
    training (resuming from the last checkpoint), the predictions after; `trained.json` last."""
    from pipeline.training.trainer import TrainingJob, train as train_model

    trained_file = plan.output_dir / TRAINED_FILE
    if plan.done or trained_file.is_file():
        return
    queries = _heldout_queries(config, plan)
    _heldout_predictions(config, plan, queries, plan.base_ref, False, "before")
    job = TrainingJob(
        stage=STAGE,
        progress_label="sft training steps",
        base_ref=plan.base_ref,
        train_files=[plan.sequences_dir / "train.parquet"],
        eval_files=[plan.sequences_dir / "eval.parquet"],
        trainer_dir=plan.trainer_dir,
        model_dir=plan.model_dir,
        settings=config.sft,
        eval_max_length=config.cpt.max_length,  # the held-out windows are CPT's, whatever SFT's rows
    )
    outcome = train_model(config, job)
    if not outcome.is_main_process:
        return
    _heldout_predictions(config, plan, queries, plan.model_dir, True, "after")
    trained = {
        "eval_observation_ce_before": outcome.eval_ce_before,
        "eval_observation_ce_after": outcome.eval_ce_after,
        "global_step": outcome.global_step,
        "resumed_from_step": outcome.resumed_from_step,
        "tokens_seen": outcome.tokens_seen,
        "train_loss_first": outcome.loss_curve[0][1] if outcome.loss_curve else None,
        "train_loss_last": outcome.loss_curve[-1][1] if outcome.loss_curve else None,
    }
    write_text_atomic(trained_file, json.dumps(trained, indent=2, sort_keys=True) + "\n")


def _summary(metrics: dict[str, Any]) -> str:
    ce = ""
    if metrics.get("eval_observation_ce_before") is not None:
        ce = f"; held-out observation CE {metrics['eval_observation_ce_before']:.3f} -> {metrics['eval_observation_ce_after']:.3f}"
    judged = ""
    if metrics.get("heldout_score_before") is not None:
        judged = f"; held-out judge score {metrics['heldout_score_before']:.2f} -> {metrics['heldout_score_after']:.2f}"
        if metrics.get("heldout_parse_rate_after") is not None:
            judged += f", thinking answers parsed {metrics['heldout_parse_rate_after']:.0%}"
    passed = f" ({n} longer than sft.max_length passed over)" if (n := metrics.get("queries_unfittable")) else ""
    return (
        f"{metrics['kept']} of {metrics['queries']} queries kept ({metrics['retention']:.1%}){passed}, "
        f"{metrics['train_sequences']} samples, {metrics['global_step']} steps{ce}{judged}"
    )


def record(store, plan: Plan) -> StageResult:
    """On the data side, after `train`: judge the held-out predictions, register the checkpoint, report."""
    from pipeline.sft.generators import build_judge

    config = SimulacraConfig.model_validate(plan.config)
    chosen = json.loads((plan.output_dir / QUERIES_FILE).read_text())
    queries = load_queries(plan.snapshot_dir, "sft", [tuple(t) for t in chosen["sft"]], config.sft.max_history_chars)
    metrics_file = plan.output_dir / METRICS_FILE
    if metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        summary = f"already trained: {_summary(metrics)} ({plan.output_dir})"
    else:
        trained_file = plan.output_dir / TRAINED_FILE
        if not trained_file.is_file():
            raise RuntimeError(f"{STAGE}: {trained_file} is missing: training did not finish")
        sampling = json.loads((plan.output_dir / SAMPLING_FILE).read_text())
        judge, judge_client = build_judge(config.sft.judge, store)
        heldout = _heldout_queries(config, plan)
        scores = {
            name: _heldout_score(heldout, json.loads((plan.output_dir / f"heldout_{name}_predictions.json").read_text()), judge)
            for name in ("before", "after")
        }
        if judge_client is not None:
            judge_client.check_failures()
        tables = _breakdowns(store, sampling["selection"], sampling["judge"], queries)
        overall = next(row for row in tables["sft-retention"] if row["domain"] == "all")
        metrics = {
            **sampling,
            **{f"retention.{row['domain']}": row["retention"] for row in tables["sft-retention"] if row["domain"] != "all"},
            "mean_winner_score": overall["mean_winner_score"],
            "invalid_judgements": sum(row["judgements"] for row in tables["sft-judgements"] if not row["valid"]),
            **json.loads(trained_file.read_text()),
            **heldout_metrics(scores),
            "fingerprint": plan.fingerprint,
            "base_model": plan.base_ref,
        }
        summary = _summary(metrics)
    # The held-out answers join the store's cache: evaluation asks these checkpoints the same queries.
    adopt_answers(store, plan.output_dir / HELDOUT_CACHE)
    complete_run(store, STAGE, plan, metrics, metrics_file)
    plot = plan.output_dir / SCORES_PLOT
    return StageResult(
        stage=STAGE, metrics=metrics, output_path=plan.model_dir, summary=summary,
        tables=_breakdowns(store, metrics["selection"], metrics["judge"], queries),
        images={"sft-score-distribution": plot} if plot.is_file() else {},
    )


def run(config, store) -> StageResult:
    """The three steps in one process (the CLI, and the pipeline flow without a GPU deployment)."""
    plan = prepare(config, store)
    store.close()  # training never holds the store (STACK.md: one process per DuckDB file)
    train(config, plan)
    return record(store, plan)
