"""Stage 1, continual pretraining (SPEC.md): next-token loss on observation tokens, thinned by keep ratios.

Read top to bottom, `run` does:
1. (main process) check that every cpt-pool turn is scored; snapshot the cpt and val pools to
   Parquet (`runs/cpt/snapshots/<pools fingerprint>`); make sure the base model exists (the tiny
   model is built from the cpt pool's own text when `model.base` is None; a GGUF base is converted
   to a folder once, pipeline/training/gguf_base.py); fingerprint the inputs;
2. (main) build the token sequences (pipeline/training/sequences.py), repeat the smaller domains' windows
   as `cpt.domain_balance` asks (pipeline/training/domain_mix.py), mix in world knowledge up to
   the configured ratio of loss tokens, write them as Parquet under the run's folder
   (`runs/cpt/<fingerprint>/sequences`: every observation label plus each thinned observation's mask
   span); close the store;
3. (every process) train from those files (pipeline/training/trainer.py, shared with the other
   training stages: packed rows, each epoch's keep-ratio masks drawn as rows are read), resuming
   from the newest complete checkpoint of the output folder if there is one
   (pipeline/training/checkpoints.py: checkpoints appear whole or not at all, and an incomplete one
   is set aside with a warning);
4. (main) save the HF folder (model + tokenizer), plot the loss, register the checkpoint.

Held-out cross-entropy: the mean, over every observation token of validation-pool trajectories (keep
ratio 1: the full observation, its closing `<|im_end|>` included), of the next-token cross-entropy,
in the same windows as training; per token, not per batch, so long observations weigh by their
length (pipeline/training/trainer.py). Measured before training (step 0) and after. Beside it, the
validation score (pipeline/training/validation.py): the base model's and the trained model's greedy
answers to the validation targets, judged, with the paired change and its interval.

One GPU or many: `accelerate launch --config_file deploy/accelerate/zero3.yaml -m stages.cpt --config FILE`
(or fsdp.yaml). Only the main process touches the store; the others wait, then read the same files.

The three halves are also called apart, for a GPU stage on a GPU pool (flows/gpu_stage.py):
`prepare` (steps 1-2, reads the store) where the data stages run, `train` (steps 3-4 without the
registration, files only) on a GPU worker, `record` (the registration) back on the data side.
"""

import json
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError
from pipeline.informativeness import SCORER_VERSION
from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.stage import StageResult
from pipeline.store.atomic_files import write_text_atomic
from pipeline.store.prerequisites import require_ingested
from pipeline.store.snapshot import (
    export_snapshot,
    pool_size,
    pools_fingerprint,
    read_pool,
    require_scores,
)
from pipeline.training import trainer as shared_trainer
from pipeline.training.domain_mix import copies, domain_factors, reseeded
from pipeline.training.models import base_model_ref, ensure_base_model

# CPT needs nothing beyond the common plan; the name `Plan` is what flows/gpu_stage.py looks up.
from pipeline.training.runs import RunPlan as Plan
from pipeline.training.runs import (
    claim_run_folder,
    launch_from_command_line,
    register_checkpoint,
    release_resume_checkpoints,
    release_run_folder,
    run_across_processes,
)
from pipeline.training.sequences import (
    IGNORE_INDEX,
    LabelTally,
    SequenceBuilder,
    SequenceWriter,
    TokenSequence,
    read_sequences,
)
from pipeline.training.tiny_model import build_tiny_model
from pipeline.training.world_knowledge import mix_world_knowledge

STAGE = "cpt"
POOLS = ("cpt", "val")
# Text the tiny model's tokenizer is trained on: 2M characters is far more than a 512-token BPE needs.
TINY_CORPUS_CHARS = 2_000_000
METRICS_FILE = "metrics.json"
STATS_FILE = "stats.json"
LOSS_CURVE = "loss_curve.png"
# Per-domain statistics of the sequences, flattened into the metrics as `<key>.<domain>` (`cpt.domain_balance`).
DOMAIN_STATS = ("domain_tokens", "domain_factors", "domain_tokens_trained")
COUNTS = (
    "trajectories",
    "trajectory_windows",  # the pool's windows, each once
    "trajectory_sequences",  # as trained: with the copies `cpt.domain_balance` asks
    "trajectory_tokens",
    "trajectory_label_tokens",
    "world_knowledge_sequences",
    "world_knowledge_tokens",
    "world_knowledge_label_tokens",
    "eval_sequences",
    "eval_observation_tokens",
)


def _write_tiny_corpus(snapshot: Path, path: Path) -> None:
    """The cpt pool as the model will see it (CPT system prompts, actions, observations), up to
    TINY_CORPUS_CHARS: the tokenizer then has merges for the template's words too."""
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        for trajectory in read_pool(snapshot, "cpt"):
            texts = [render_cpt_system_prompt(trajectory.domain, trajectory.system)]
            texts += [text for turn in trajectory.turns for text in (turn.action, turn.observation)]
            for text in texts:
                handle.write(text + "\n")
                written += len(text) + 1
            if written >= TINY_CORPUS_CHARS:
                return


def _ensure_base_model(config, snapshot: Path, base_ref: str) -> None:
    """A GGUF base converted to a folder, or the tiny model, trained on the cpt pool's text so its
    tokenizer fits the domain, if it is not there."""
    if config.model.base is not None:
        ensure_base_model(config)
        return
    if (Path(base_ref) / "config.json").is_file():
        return
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "cpt-pool.txt"
        _write_tiny_corpus(snapshot, corpus)
        build_tiny_model(config.model.tiny, [corpus], Path(base_ref))


def _plan(config, store) -> Plan:
    require_ingested(store)  # an empty store's "pool 'cpt' holds no trajectory: run split" named the wrong fix
    require_scores(store, "cpt", config.section_hash("score"), SCORER_VERSION)
    if pool_size(store, "cpt") == 0:
        raise UserFixableError("pool 'cpt' holds no trajectory: run `simulacra split` first")
    # The snapshot depends on the pools alone, so it can exist before the model (the tiny model's
    # tokenizer is trained from it) and be shared by runs that differ in anything else.
    pools = pools_fingerprint(store, POOLS)
    snapshot = export_snapshot(store, config.workspace.runs_dir / STAGE / "snapshots" / pools.replace(":", "-"), POOLS)
    base_ref = base_model_ref(config)
    _ensure_base_model(config, snapshot, base_ref)
    output_dir, fingerprint = claim_run_folder(config, store, STAGE, config.cpt.output_dir)
    return Plan(
        output_dir,
        snapshot,
        fingerprint,
        base_ref,
        done=(output_dir / METRICS_FILE).is_file(),
        keep_resume_checkpoints=config.workspace.keep_resume_checkpoints,
    )


def _build_sequences(config, plan: Plan, tokenizer) -> dict[str, Any]:
    """Tokenise the snapshot into train.parquet and eval.parquet, streaming; returns their statistics."""
    stats_path = plan.sequences_dir / STATS_FILE
    if stats_path.is_file():
        return json.loads(stats_path.read_text())
    cpt = config.cpt
    builder = SequenceBuilder(tokenizer, cpt.max_length, cpt.seed, cpt.outcome_head_tokens)
    plan.sequences_dir.mkdir(parents=True, exist_ok=True)
    counted = dict.fromkeys(COUNTS, 0)
    tally = LabelTally()
    # The windows go to a staging file first: how often each is trained on depends on every domain's tokens.
    staged = plan.sequences_dir / "trajectory_windows.parquet"
    domain_of: dict[str, str] = {}
    domain_tokens: Counter[str] = Counter()
    with SequenceWriter(staged) as staging:
        for trajectory in read_pool(plan.snapshot_dir, "cpt"):
            prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
            windows, counts = builder.trajectory_sequences(trajectory.trajectory_id, prompt, trajectory.turns)
            tally.merge(counts)
            counted["trajectories"] += 1
            domain_of[trajectory.trajectory_id] = trajectory.domain
            for window in windows:
                staging.write(window)
                counted["trajectory_windows"] += 1
                domain_tokens[trajectory.domain] += len(window.input_ids)
    if not counted["trajectory_windows"]:
        staged.unlink()
        raise RuntimeError(
            "the cpt pool produced no sequence with a label (every keep ratio 0, or every turn too long)"
        )
    factors = domain_factors(domain_tokens, cpt.domain_balance)
    trained_tokens: Counter[str] = Counter()
    with SequenceWriter(plan.sequences_dir / "train.parquet") as train:
        for window in read_sequences(staged):
            domain = domain_of[window.source]
            first_turn = window.turn_indices[0] if window.turn_indices else 0
            window.stratum = domain  # the row order balances the environments (pipeline/training/row_order.py)
            for copy in range(copies(factors[domain], cpt.seed, window.source, first_turn)):
                sequence = reseeded(window, copy)
                train.write(sequence)
                counted["trajectory_sequences"] += 1
                counted["trajectory_tokens"] += len(sequence.input_ids)
                counted["trajectory_label_tokens"] += _labelled(sequence)
                trained_tokens[domain] += len(sequence.input_ids)
        # The ratio counts loss tokens (epoch 0's masks; later epochs draw as many in expectation).
        documents = mix_world_knowledge(
            builder, cpt.world_knowledge, counted["trajectory_label_tokens"], cpt.world_knowledge_token_ratio, cpt.seed
        )
        for document in documents:
            document.stratum = document.kind
            train.write(document)
            counted["world_knowledge_sequences"] += 1
            counted["world_knowledge_tokens"] += len(document.input_ids)
            counted["world_knowledge_label_tokens"] += _labelled(document)
    staged.unlink()
    with SequenceWriter(plan.sequences_dir / "eval.parquet") as held_out:
        for trajectory in read_pool(plan.snapshot_dir, "val"):
            prompt = render_cpt_system_prompt(trajectory.domain, trajectory.system)
            windows, _ = builder.trajectory_sequences(
                trajectory.trajectory_id, prompt, trajectory.turns, full_labels=True
            )
            for window in windows[: cpt.eval_max_sequences - counted["eval_sequences"]]:
                held_out.write(window)
                counted["eval_sequences"] += 1
                counted["eval_observation_tokens"] += _labelled(window)
            if counted["eval_sequences"] >= cpt.eval_max_sequences:
                break
    label_tokens = counted["trajectory_label_tokens"] + counted["world_knowledge_label_tokens"]
    stats = {
        **counted,
        "trajectory_label_fraction": counted["trajectory_label_tokens"] / counted["trajectory_tokens"],
        # Loss tokens, as configured; the input-token ratio and the share of all loss tokens beside it.
        "world_knowledge_ratio": counted["world_knowledge_label_tokens"] / max(1, counted["trajectory_label_tokens"]),
        "world_knowledge_ratio_configured": cpt.world_knowledge_token_ratio,
        "world_knowledge_input_ratio": counted["world_knowledge_tokens"] / counted["trajectory_tokens"],
        "world_knowledge_loss_share": counted["world_knowledge_label_tokens"] / max(1, label_tokens),
        # Each domain's trajectory tokens in the pool and as trained (`cpt.domain_balance`), and the factor between.
        "domain_balance": cpt.domain_balance,
        "domain_tokens": dict(sorted(domain_tokens.items())),
        "domain_factors": {domain: round(factor, 4) for domain, factor in sorted(factors.items())},
        "domain_tokens_trained": dict(sorted(trained_tokens.items())),
        # Epoch 0's labels; content and end tokens apart, so the end tokens cannot hide a content rate.
        "keep_ratio": dict(sorted(tally.keep_ratios.items())),
        "content_tokens": dict(tally.content_tokens),
        "content_label_tokens": dict(tally.content_labels),
        "end_tokens": dict(tally.end_tokens),
        "end_label_tokens": dict(tally.end_labels),
        "label_fraction_content": tally.content_fractions(),
        "label_fraction_end": tally.end_fractions(),
        "truncated_observations": tally.truncated_observations,
        "observation_tokens_cut": tally.observation_tokens_cut,
        "dropped_turns": tally.dropped_turns,
        "unlabelled_windows": tally.unlabelled_windows,
        "truncated_system_prompts": tally.truncated_system_prompts,
    }
    # Written last, atomically: its presence says both files are complete.
    write_text_atomic(stats_path, json.dumps(stats, indent=2, sort_keys=True) + "\n")
    return stats


def _labelled(sequence: TokenSequence) -> int:
    """Labels of epoch 0 (the labels of every epoch where the sequence has no keep-ratio span)."""
    return sum(1 for label in sequence.labels_at(0) if label != IGNORE_INDEX)


def _train(config, plan: Plan) -> dict[str, Any]:
    job = shared_trainer.TrainingJob(
        stage=STAGE,
        progress_label="cpt training steps",
        base_ref=plan.base_ref,
        train_files=[plan.sequences_dir / "train.parquet"],
        eval_files=[plan.sequences_dir / "eval.parquet"],
        trainer_dir=plan.trainer_dir,
        model_dir=plan.model_dir,
        settings=config.cpt,
    )
    outcome = shared_trainer.train(config, job)
    return {
        "eval_observation_ce_before": outcome.eval_ce_before,
        "eval_observation_ce_after": outcome.eval_ce_after,
        "eval_observation_tokens_scored": outcome.eval_tokens_scored,
        "global_step": outcome.global_step,
        "epochs": outcome.epochs,
        # The epochs this run drew keep-ratio masks for (a resumed run: from the one it resumed in).
        "mask_epochs": outcome.mask_epochs,
        "first_step_this_run": outcome.first_step_this_run,
        "resumed_from_step": outcome.resumed_from_step,
        "tokens_seen": outcome.tokens_seen,
        "loss_curve": outcome.loss_curve,
        "is_main_process": outcome.is_main_process,
        "attention_implementation": outcome.attention,
        "loss_implementation": outcome.loss,
        "tokens_per_step": outcome.tokens_per_step,
    }


def _plot(
    path: Path, curve: list[tuple[int, float]], before: float | None, after: float | None, final_step: int
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    if curve:
        label = "train loss (labelled tokens: kept observations + world knowledge)"
        axes.plot([step for step, _ in curve], [loss for _, loss in curve], label=label)
    if before is not None and after is not None:
        axes.plot([0, final_step], [before, after], "o--", label="held-out observation CE")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("cross-entropy (nats/token)")
    axes.set_title("Continual pretraining")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _result(plan: Plan, metrics: dict[str, Any], stats: dict[str, Any], summary: str) -> StageResult:
    categories = [
        {
            "category": category,
            "keep_ratio": keep_ratio,
            "content_tokens": stats["content_tokens"].get(category, 0),
            "content_label_tokens": stats["content_label_tokens"].get(category, 0),
            "content_label_fraction": round(stats["label_fraction_content"].get(category, 0.0), 4),
            "end_tokens": stats["end_tokens"].get(category, 0),
            "end_label_tokens": stats["end_label_tokens"].get(category, 0),
            "end_label_fraction": round(stats["label_fraction_end"].get(category, 0.0), 4),
        }
        for category, keep_ratio in stats["keep_ratio"].items()
    ]
    curve = plan.output_dir / LOSS_CURVE
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=plan.model_dir,
        summary=summary,
        tables={"cpt-label-fractions": categories},
        images={"cpt-loss-curve": curve} if curve.is_file() else {},
    )


def _summary(metrics: dict[str, Any]) -> str:
    from pipeline.training.validation import summary_words

    before, after = metrics["eval_observation_ce_before"], metrics["eval_observation_ce_after"]
    ce = (
        f"validation observation CE {before:.3f} -> {after:.3f}"
        if before is not None and after is not None
        else "no validation CE (the val pool is empty)"
    )
    resumed = f", resumed from step {metrics['resumed_from_step']}" if metrics["resumed_from_step"] else ""
    scored = summary_words(metrics)
    return (
        f"{metrics['global_step']} steps{_epoch_words(metrics)} on {metrics['trajectory_sequences']} trajectory windows "
        f"+ {metrics['world_knowledge_sequences']} world-knowledge chunks{_corpus_short(metrics)}"
        f"{_domain_words(metrics)}{resumed}; {ce}" + (f"; {scored}" if scored else "")
    )


def _epoch_words(metrics: dict[str, Any]) -> str:
    """How much of the packed rows the steps covered. Under one epoch the rows a budget trains on are the shuffle's
    draw, so the seed alone moves what CPT learns: the demo's 32 steps (0.13 of an epoch) scored 46.0, 34.9 and 42.1 on
    the same 57 validation targets at seeds 0, 1 and 2 (docs/performance.md)."""
    epochs = metrics.get("epochs")
    if not epochs:
        return ""
    return f" ({epochs:.2f} of an epoch)" if epochs < 1 else f" ({epochs:.2f} epochs)"


def _by_domain(metrics: dict[str, Any], key: str) -> dict[str, Any]:
    prefix = f"{key}."
    return {name[len(prefix) :]: value for name, value in metrics.items() if name.startswith(prefix)}


def _domain_words(metrics: dict[str, Any]) -> str:
    """Where `cpt.domain_balance` repeated windows: each domain's share of the trajectory tokens, in the pool -> as
    trained, so a reader of the summary knows what the steps saw."""
    pool, trained = _by_domain(metrics, "domain_tokens"), _by_domain(metrics, "domain_tokens_trained")
    if metrics.get("domain_balance", 1) == 1 or not pool or pool == trained:
        return ""
    pool_total, trained_total = sum(pool.values()), sum(trained.values())
    shares = ", ".join(
        f"{domain} {pool[domain] / pool_total:.0%} -> {trained.get(domain, 0) / trained_total:.0%}" for domain in pool
    )
    return f" (domains weighed, balance {metrics['domain_balance']:g}: {shares})"


def _corpus_short(metrics: dict[str, Any]) -> str:
    """Where the corpus held fewer labels than the configured ratio asked, it was used whole, once: say so, or a
    raised `world_knowledge_token_ratio` would look applied while it changed nothing."""
    asked = metrics.get("world_knowledge_ratio_configured") or 0.0
    trajectory_labels = metrics.get("trajectory_label_tokens", 0)
    have = metrics.get("world_knowledge_label_tokens", 0)
    if not metrics.get("world_knowledge_sequences") or have >= int(round(asked * trajectory_labels)):
        return ""
    return f" (the whole corpus, {have:,} labels: a ratio of {have / trajectory_labels:.2f} where {asked:g} was asked)"


def prepare(config, store) -> Plan:
    """Main process, on the data side: everything that reads the store (scores check, snapshot,
    fingerprint) or the config's paths (world knowledge), down to the token sequences as Parquet."""
    from pipeline.training import validation

    plan = _plan(config, store)
    if not plan.done:
        tokenizer, _ = shared_trainer.load_tokenizer_with_chatml(config, plan.base_ref)
        _build_sequences(config, plan, tokenizer)
        validation.write_targets(plan.output_dir, validation.choose(store, config, plan.snapshot_dir))
        validation.check_budget(
            config, tokenizer, validation.read_queries(config, plan.output_dir, plan.snapshot_dir), 0
        )
    return plan


def train(config, plan: Plan) -> None:
    """Every process, from the plan's files only (never the store): train, resuming from the last
    checkpoint; the main process saves the model, the loss curve and, last, metrics.json."""
    if plan.done:
        return
    from pipeline.prompts.answer_format import NON_THINKING, write_model_format
    from pipeline.training import validation

    trained = _train(config, plan)
    if not trained.pop("is_main_process"):
        return
    write_model_format(plan.model_dir, NON_THINKING)
    # The base model and the trained one, each asked in CPT's format (the base has no other).
    measured = validation.measure(
        config,
        validation.read_queries(config, plan.output_dir, plan.snapshot_dir),
        plan.output_dir,
        (plan.base_ref, NON_THINKING),
        (str(plan.model_dir), NON_THINKING),
    )
    stats = json.loads((plan.sequences_dir / STATS_FILE).read_text())
    curve = trained.pop("loss_curve")
    metrics = {
        **{k: v for k, v in stats.items() if not isinstance(v, dict)},
        **trained,
        **{f"label_fraction_content.{c}": f for c, f in stats["label_fraction_content"].items()},
        **{f"label_fraction_end.{c}": f for c, f in stats["label_fraction_end"].items()},
        **{f"{key}.{domain}": value for key in DOMAIN_STATS for domain, value in stats.get(key, {}).items()},
        "train_loss_first": curve[0][1] if curve else None,
        "train_loss_last": curve[-1][1] if curve else None,
        **measured,
        "fingerprint": plan.fingerprint,
        "base_model": plan.base_ref,
    }
    before, after = metrics["eval_observation_ce_before"], metrics["eval_observation_ce_after"]
    _plot(plan.output_dir / LOSS_CURVE, curve, before, after, metrics["global_step"])
    (plan.output_dir / "loss_curve.json").write_text(json.dumps(curve) + "\n")
    # Written last, atomically: its presence marks the run complete, so a rerun returns instead of retraining.
    write_text_atomic(plan.output_dir / METRICS_FILE, json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def record(store, plan: Plan) -> StageResult:
    """Main process, on the data side, after `train`: register the checkpoint, report the run."""
    metrics_file = plan.output_dir / METRICS_FILE
    if not metrics_file.is_file():
        raise RuntimeError(f"{STAGE}: {metrics_file} is missing: training did not finish")
    metrics = json.loads(metrics_file.read_text())
    stats_file = plan.sequences_dir / STATS_FILE
    stats = json.loads(stats_file.read_text()) if stats_file.is_file() else {}
    register_checkpoint(store, STAGE, plan, metrics)
    release_resume_checkpoints(plan, metrics_file)
    release_run_folder(plan.output_dir)
    summary = f"already trained: {_summary(metrics)} ({plan.output_dir})" if plan.done else _summary(metrics)
    return _result(plan, metrics, stats, summary)


def run(config, store) -> StageResult:
    return run_across_processes(STAGE, prepare, train, record, config, store)


def main(argv: list[str] | None = None) -> None:
    launch_from_command_line(STAGE, run, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
