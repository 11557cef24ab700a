"""Stage 2, rejection-sampled SFT (SPEC.md; issue 10), in the thinking or the direct format (issue 28).

Three steps, as CPT's (flows/gpu_stage.py runs the middle one on a GPU worker when
`orchestration.gpu_deployment` is set; `run` runs all three in one process):
1. `prepare`, on the data side, with the store: the model SFT starts from (the registered CPT
   checkpoint unless `sft.base_model`), a Parquet snapshot of the cpt, sft and val pools, the
   fingerprint; a seeded choice of the sft pool's target turns (`sft.max_queries`; a turn too long
   for `sft.max_length` even with the shortest template and no history is passed over before anything
   is generated for it). Then, in the format `answers.thinking` chooses:
   - thinking: rejection sampling (pipeline/sft/sampling.py): K candidates, strictly parsed, judged
     against the real observation, the ones that pass `min_score` and the thinking check compared
     pairwise round robin in both orders (by the LLM judge; the similarity judge's ranking decides
     alone), a keep/discard decision per query, every row committed as it is produced, so a killed
     run resumes where it was;
   - direct: every chosen query is a sample, its target the real observation; nothing is generated
     or judged (`_direct_samples` says why);
   then the training sequences of the kept queries (pipeline/sft/samples.py: one of ten system
   templates per sample, asking for the run's format; labels on the assistant output only, and in the
   direct format on every observation of the kept history too: `sft.label_history`), the
   held-out sequences (the val pool in CPT's format and windows, so the cross-entropy is comparable
   with CPT's) and the validation targets;
2. `train`, from files only: training through the shared packed Trainer path
   (pipeline/training/trainer.py), resuming from its last checkpoint; the format beside the model
   (`answer_format.json`); the validation score (pipeline/training/validation.py) of the starting
   model in its own format and of the trained model in SFT's;
3. `record`, on the data side: the checkpoint is registered; `metrics.json` marks the run complete.

The target of a kept thinking sample ends with the winner's thinking followed by the *real*
observation, not the winner's prediction: the judge admits a prediction that differs from the
environment where the rubric only asks for plausibility (a PID, a timestamp, an unseen file's
contents); training on it would teach the generator's guesses as facts, where the real observation
is the environment's own answer. The thinking stays the winner's, the reasoning the data lacks, and
it must lead to the observation it is trained before: SPEC's "If the best falls below a minimum score
the query is discarded" read for a target of thinking + real observation. So a candidate competes
only when its own prediction agrees with the real observation on deterministic content
(`sft.min_content_agreement` for the similarity judge, the judge's factuality `sft.min_factuality`
for the LLM judge), besides `min_score`; a query with no such candidate is discarded as
`thinking_inconsistent` (issue 17, item 7: in the demo 23 of 28 kept winners predicted another record
than the one trained on).
"""

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import SimulacraConfig
from pipeline.errors import UserFixableError
from pipeline.orchestration.faults import maybe_fail
from pipeline.progress import progress_bar
from pipeline.prompts.answer_format import answer_format, model_format, stage_format, write_model_format
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.sft.base_model import sft_base_ref
from pipeline.sft.candidates import render_thinking_output
from pipeline.sft.queries import Query, choose_targets, load_queries
from pipeline.stage import StageResult
from pipeline.store.atomic_files import write_text_atomic
from pipeline.store.prerequisites import require_ingested
from pipeline.store.snapshot import export_snapshot, pools_fingerprint, read_pool, target_turns
from pipeline.training.budgets import THINKING_P95, answer_tokens, percentile_95, require_budget
from pipeline.training.models import load_tokenizer
from pipeline.training.runs import RunPlan, claim_run_folder, complete_run, model_words

STAGE = "sft"
POOLS = ("cpt", "sft", "val")
METRICS_FILE = "metrics.json"
QUERIES_FILE = "queries.json"  # the sft queries and the validation targets, as (trajectory, turn)
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
    require_ingested(store)  # before "run `simulacra cpt` first", which an empty store does not need first
    base_ref = sft_base_ref(config, store)
    if not target_turns(store, "sft"):
        raise UserFixableError(
            "pool 'sft' has no target turns: run `simulacra split` first (or give the sft pool a share)"
        )
    pools = pools_fingerprint(store, POOLS)
    snapshot = export_snapshot(store, config.workspace.runs_dir / STAGE / "snapshots" / pools.replace(":", "-"), POOLS)
    output_dir, fingerprint = claim_run_folder(config, store, STAGE, config.sft.output_dir)
    done = (output_dir / METRICS_FILE).is_file()
    return Plan(
        output_dir,
        snapshot,
        fingerprint,
        base_ref,
        done,
        config.workspace.keep_resume_checkpoints,
        pools=pools,
        config=config.model_dump(mode="json"),
    )


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
        store,
        generators,
        judge,
        judge_label,
        sft.min_score,
        sft.min_agreement,
        sft.seed,
        sft.batch_queries,
        after_batch,
    )
    with progress_bar("sft queries sampled and judged", total=len(queries)) as advance:
        tally = sampler.run(queries, advance)
    for client in clients:
        client.check_failures()
    return sampler, tally


def _reasons(selections: list[dict[str, Any]]) -> str:
    counts = Counter(row["reason"] for row in selections)
    return ", ".join(f"{reason} {n}" for reason, n in counts.most_common()) or "none decided"


def _kept_none(store, sft, sampler, queries: list[Query], selections: list[dict[str, Any]]) -> str:
    """Why no query was kept, and the fix. Candidates refused for holding the API key (`held_secret`) come
    first: no threshold or generator helps while the endpoint echoes credentials (issue 29.5)."""
    held = store.scalar(
        "SELECT count(*) FROM sft_candidates WHERE parse_status = 'held_secret' AND query_id IN (SELECT unnest(?::VARCHAR[])) "
        "AND generator IN (SELECT unnest(?::VARCHAR[]))",
        [_query_ids(queries), [generator.label for generator in sampler.generators]],
    )
    kept_none = f"sft kept none of {len(queries)} queries ({_reasons(selections)})"
    if held:
        return (
            f"{kept_none}: {held} candidate(s) held the API key (held_secret), so the generator endpoint echoes "
            "credentials into its answers (a debugging proxy copying the Authorization header does): point "
            "sft.generators at an endpoint that does not, then rerun; see the sft_candidates table"
        )
    if selections and all(row["reason"] == "no_parsed_candidate" for row in selections):
        # No threshold applies to answers that never parsed: lowering sft.min_score, the old advice, changes nothing.
        return (
            f"{kept_none}: no candidate parsed in the thinking format (a thinking block, then the observation), so "
            "the generator does not write it: use a reasoning generator, set `rationale: true` on it (it writes "
            "the observation, then a thinking that explains it), or train directly (answers.thinking: false); "
            "the sft_candidates table's parse_status says what each answer lacked"
        )
    return (
        f"{kept_none}: see the sft_samples table; lower sft.min_score ({sft.min_score:g}) or the thinking check "
        f"({_thinking_check(sft)}), or use a stronger generator"
    )


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
    candidates = [
        row[0]
        for row in store.execute(
            "SELECT score FROM judgements WHERE kind = 'pointwise' AND judge = ? AND query_id IN (SELECT unnest(?::VARCHAR[]))",
            [judge_label, ids],
        ).fetchall()
    ]
    winners = [
        row[0]
        for row in store.execute(
            "SELECT score FROM sft_samples WHERE selection = ? AND score IS NOT NULL AND query_id IN (SELECT unnest(?::VARCHAR[]))",
            [selection, ids],
        ).fetchall()
    ]
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
def _build_sequences(
    config, plan: Plan, selections: list[dict[str, Any]], queries: list[Query], thinking: bool
) -> dict[str, Any]:
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
    counted: Counter[str] = Counter()
    templates: Counter[int] = Counter()
    thinking_lengths: list[int] = []
    builder = SequenceBuilder(tokenizer, config.sft.max_length, config.sft.seed)
    # The history's observations are labels in the direct format only (pipeline/sft/samples.py says why).
    label_history = config.sft.label_history and not thinking
    with SequenceWriter(plan.sequences_dir / "train.parquet") as train:
        for row in selections:
            if not row["kept"]:
                continue
            query = by_id[row["query_id"]]
            system = TEMPLATES[row["template_id"]].render(query.domain, query.system, thinking)
            # Thinking: the winner's thinking, then the real observation; direct: the real observation alone.
            target = render_thinking_output(row["thinking"], query.reference) if thinking else query.reference
            built = sft_sequence(
                builder,
                query.trajectory_id,
                system,
                query.history,
                query.action,
                target,
                query.turn_index,
                label_history=label_history,
            )
            counted["history_turns_dropped"] += built.history_dropped
            if built.sequence is None:
                counted["samples_too_long"] += 1
                continue
            built.sequence.stratum = query.domain  # balanced by the row order (pipeline/training/row_order.py)
            train.write(built.sequence)
            # The thinking block as taught, tags and separator included: what a held-out answer spends
            # before its observation (pipeline/training/budgets.py).
            if thinking:
                thinking_lengths.append(
                    len(tokenizer.encode(render_thinking_output(row["thinking"], ""), add_special_tokens=False))
                )
            templates[row["template_id"]] += 1
            counted["train_sequences"] += 1
            counted["train_tokens"] += len(built.sequence.input_ids)
            counted["train_label_tokens"] += sum(1 for label in built.sequence.labels if label != -100)
            counted["history_label_tokens"] += built.history_labels
    # The validation pool exactly as CPT measures it (its template, windows, max_length and cap), so the
    # two stages' observation cross-entropies are on the same tokens.
    cpt_builder = SequenceBuilder(tokenizer, config.cpt.max_length, config.cpt.seed)
    with SequenceWriter(plan.sequences_dir / "eval.parquet") as held_out:
        for trajectory in read_pool(plan.snapshot_dir, "val"):
            prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
            windows, _ = cpt_builder.trajectory_sequences(
                trajectory.trajectory_id, prompt, trajectory.turns, full_labels=True
            )
            for window in windows[: config.cpt.eval_max_sequences - counted["eval_sequences"]]:
                held_out.write(window)
                counted["eval_sequences"] += 1
            if counted["eval_sequences"] >= config.cpt.eval_max_sequences:
                break
    stats = {
        **{
            k: counted[k]
            for k in (
                "train_sequences",
                "train_tokens",
                "train_label_tokens",
                "history_label_tokens",
                "samples_too_long",
                "history_turns_dropped",
                "eval_sequences",
            )
        },
        THINKING_P95: percentile_95(thinking_lengths),
        "templates": {str(t): n for t, n in sorted(templates.items())},
    }
    stats_path.write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n")  # last: marks both files complete
    return stats


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
            require_budget(
                f"sft.generators[{position}].endpoint.max_tokens",
                generator.endpoint.max_tokens,
                needed,
                "the observations of the sft queries",
            )


# -- 5. the three steps: prepare (data side), train (training side), record (data side) ------------
def prepare(config, store) -> Plan:
    """Everything that reads or writes the store: sampling and judging, then the Parquet sequences."""
    from transformers.utils import logging as hf_logging

    from pipeline.config.answers import resolve_thinking
    from pipeline.training import validation

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
    thinking = resolve_thinking(config)
    if thinking:
        selections, sampled = _rejection_sample(config, store, plan, queries, tokenizer)
    else:
        selections, sampled = _direct_samples(sft, queries), {"selection": DIRECT_SELECTION}
    kept = sum(1 for row in selections if row["kept"])
    stats = _build_sequences(config, plan, selections, queries, thinking)
    if not stats["train_sequences"]:
        raise UserFixableError(
            f"none of the {kept} kept samples fits in sft.max_length ({sft.max_length} tokens) even without history: "
            "raise sft.max_length"
        )
    targets = validation.choose(store, config, plan.snapshot_dir)
    validation.write_targets(plan.output_dir, targets)
    validation.check_budget(
        config,
        tokenizer,
        validation.read_queries(config, plan.output_dir, plan.snapshot_dir),
        stats.get(THINKING_P95, 0),
    )
    write_text_atomic(plan.output_dir / QUERIES_FILE, json.dumps({"sft": chosen, "val": targets}) + "\n")
    sampling = {
        "queries": len(queries),
        "queries_unfittable": unfittable,
        "kept": kept,
        "retention": kept / len(queries),
        # Queries whose generator or judge request failed, tolerated under max_failed_fraction: no sample row, so
        # neither kept nor discarded, and left out of this run's training.
        "undecided": len(queries) - len(selections),
        "answer_format": stage_format(STAGE, thinking).name,
        **sampled,
        **{k: v for k, v in stats.items() if not isinstance(v, dict)},
        **{f"template.{t}": n for t, n in stats["templates"].items()},
    }
    write_text_atomic(plan.output_dir / SAMPLING_FILE, json.dumps(sampling, indent=2, sort_keys=True) + "\n")
    return plan


# What `sampling.json` names as the selection of a direct run: nothing was generated or selected.
DIRECT_SELECTION = "direct: the real observations, nothing generated"


def _direct_samples(sft, queries: list[Query]) -> list[dict[str, Any]]:
    """Direct SFT (issue 28): every chosen query is a sample whose target is the real observation, under
    its drawn template. There is nothing to reject: rejection sampling chooses among generated thinking,
    and the real observation is already the environment's own answer (the thinking format's target
    ends with it too). So nothing is generated or judged, and the budget SFT spent on sampling goes to
    training. `simulacra stats` and the sft_samples table stay as the last thinking run left them."""
    from pipeline.prompts.sft import draw_template

    return [
        {
            "query_id": q.query_id,
            "kept": True,
            "thinking": None,
            "template_id": draw_template(sft.seed, q.trajectory_id, q.turn_index).template_id,
        }
        for q in queries
    ]


def _rejection_sample(
    config, store, plan: Plan, queries: list[Query], tokenizer
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Thinking SFT: K candidates per query, judged, the winners kept (SPEC.md, Stage 2); the selections
    (one row per query) and what sampling did, for `sampling.json`."""
    from pipeline.sft.generators import build_judge, judge_label

    sft = config.sft
    _check_generator_budgets(sft, tokenizer, queries)
    label = judge_label(sft.judge)
    judge, judge_client = build_judge(sft.judge, store)
    sampler, tally = _sample(config, store, plan, queries, judge, label)
    if judge_client is not None:
        judge_client.check_failures()  # a broken judge fails the stage before anything trains
    selections = _selections(store, sampler.selection, queries)
    kept = sum(1 for row in selections if row["kept"])
    if not kept:
        raise UserFixableError(_kept_none(store, sft, sampler, queries, selections))
    _plot_scores(store, plan, label, sampler.selection, queries, sft.min_score)
    return selections, {
        "candidates_per_query": sft.candidates_per_query,
        "candidates_generated_this_run": tally.candidates_generated,
        "judgements_this_run": tally.pointwise_judged + tally.pairwise_judged,
        "judge": label,
        "thinking_check": _thinking_check(sft),
        "selection": sampler.selection,
    }


def train(config, plan: Plan) -> None:
    """From the plan's files only (never the store): training (resuming from the last checkpoint), then
    the validation score of the model before SFT and after it, each in its own format; `trained.json` last."""
    from pipeline.training import validation
    from pipeline.training.trainer import TrainingJob
    from pipeline.training.trainer import train as train_model

    trained_file = plan.output_dir / TRAINED_FILE
    if plan.done or trained_file.is_file():
        return
    fmt = answer_format(json.loads((plan.output_dir / SAMPLING_FILE).read_text())["answer_format"])
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
    write_model_format(plan.model_dir, fmt)
    # The starting model in the format it was trained in (CPT's, for a CPT checkpoint), the new one in SFT's.
    measured = validation.measure(
        config,
        validation.read_queries(config, plan.output_dir, plan.snapshot_dir),
        plan.output_dir,
        (plan.base_ref, model_format(plan.base_ref, None)),
        (str(plan.model_dir), fmt),
    )
    trained = {
        **measured,
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
    from pipeline.training.validation import summary_words

    ce = ""
    if metrics.get("eval_observation_ce_before") is not None:
        ce = f"; validation observation CE {metrics['eval_observation_ce_before']:.3f} -> {metrics['eval_observation_ce_after']:.3f}"
    scored = summary_words(metrics)
    passed = f" ({n} longer than sft.max_length passed over)" if (n := metrics.get("queries_unfittable")) else ""
    kept = (
        f"{metrics['queries']} queries, their real observations as targets"
        if metrics["selection"] == DIRECT_SELECTION
        else f"{metrics['kept']} of {metrics['queries']} queries kept ({metrics['retention']:.1%})"
    )
    started = f"from {model_words(metrics['base_model'])}, " if metrics.get("base_model") else ""
    # Found by probing: half the candidates failed the thinking format (`unclosed_think`, `extra_think_tag`) and the
    # line said "6 of 6 queries kept"; the counts were in a Prefect artifact alone.
    statuses = {key.removeprefix("candidates."): n for key, n in metrics.items() if key.startswith("candidates.") and n}
    parsed = ""
    if statuses:
        failed = sorted(((n, status) for status, n in statuses.items() if status != "ok"), reverse=True)
        parsed = f"; candidates parsed {statuses.get('ok', 0)} of {sum(statuses.values())}" + (
            f" ({', '.join(f'{status} {n}' for n, status in failed)})" if failed else ""
        )
    # Found by probing: a query whose request failed read as not kept, and the rerun said "already trained".
    undecided = (
        f"; {n} undecided (a generator or judge request failed, under max_failed_fraction: not trained on; this "
        "run's folder is done, so remove it and rerun to ask them again)"
        if (n := metrics.get("undecided"))
        else ""
    )
    return (
        f"{started}{metrics.get('answer_format', 'thinking')} format: {kept}{passed}, "
        f"{metrics['train_sequences']} samples, {metrics['global_step']} steps{ce}"
        + (f"; {scored}" if scored else "")
        + parsed
        + (f"; {n} kept samples longer than sft.max_length left out" if (n := metrics.get("samples_too_long")) else "")
        + undecided
    )


def record(store, plan: Plan) -> StageResult:
    """On the data side, after `train`: register the checkpoint, report."""
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
        selected = {}
        if sampling["selection"] != DIRECT_SELECTION:
            tables = _breakdowns(store, sampling["selection"], sampling["judge"], queries)
            overall = next(row for row in tables["sft-retention"] if row["domain"] == "all")
            selected = {
                **{
                    f"retention.{row['domain']}": row["retention"]
                    for row in tables["sft-retention"]
                    if row["domain"] != "all"
                },
                "mean_winner_score": overall["mean_winner_score"],
                "invalid_judgements": sum(row["judgements"] for row in tables["sft-judgements"] if not row["valid"]),
                **{
                    f"candidates.{status}": sum(
                        row["candidates"] for row in tables["sft-candidates"] if row["parse_status"] == status
                    )
                    for status in {row["parse_status"] for row in tables["sft-candidates"]}
                },
            }
        metrics = {
            **sampling,
            **selected,
            **json.loads(trained_file.read_text()),
            "fingerprint": plan.fingerprint,
            "base_model": plan.base_ref,
        }
        summary = _summary(metrics)
    complete_run(store, STAGE, plan, metrics, metrics_file)
    plot = plan.output_dir / SCORES_PLOT
    tables = (
        {}
        if metrics["selection"] == DIRECT_SELECTION
        else _breakdowns(store, metrics["selection"], metrics["judge"], queries)
    )
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=plan.model_dir,
        summary=summary,
        tables=tables,
        images={"sft-score-distribution": plot} if plot.is_file() else {},
    )


def run(config, store) -> StageResult:
    """The three steps in one process (the CLI, and the pipeline flow without a GPU deployment)."""
    plan = prepare(config, store)
    store.close()  # training never holds the store (STACK.md: one process per DuckDB file)
    train(config, plan)
    return record(store, plan)
