"""The export stage (issue 12, "The checkpoint"): the world-model checkpoint the pipeline exists for.

Read top to bottom, `run` does:
1. resolve what to export: `export.checkpoint` (a checkpoint_id or a model folder), else among the
   newest registered checkpoint of each training stage (rl, sft, cpt) the one with the best validation
   score (pipeline/serving/export_choice.py; the summary, the model card and the `export-choice` table
   name the choice, the runner-up and the margin with its interval);
2. pick its prompt format: `export.prompt_format`, else the template and answer format it was trained in
   (pipeline/serving/prompt_formats.py, pipeline/prompts/answer_format.py);
3. write the folder (pipeline/serving/export_folder.py: safetensors, tokenizer with the world-model
   chat template, a generation config that stops at `<|im_end|>`, `simulacra.json` with the length
   and history budget the model was trained at (pipeline/serving/provenance.py), the model card in
   the Hub's conventions with the evaluation table of the exported checkpoint: it beside every model
   evaluated on the same eval set with the same judge, pipeline/evaluation/report.py; and its closed-loop
   fidelity and policy agreement, where `simulacra fidelity` measured it); no file names a path of this machine;
4. register it in `checkpoints` with stage `export`, and copy it to `export.destination` when set.
A rerun with the same fingerprint finds the folder complete and only registers and copies again.
"""

import json
from pathlib import Path

from pipeline.evaluation.report import evaluation_rows
from pipeline.orchestration.faults import maybe_fail
from pipeline.orchestration.fingerprint import stage_fingerprint
from pipeline.serving.export_folder import METADATA_FILE, copy_to, destination_filesystem, write_export
from pipeline.serving.export_source import resolve_format, resolve_source
from pipeline.serving.model_card import (
    CardFacts,
    collect_fidelity,
    collect_pools,
    collect_sources,
    collect_stages,
    example_request,
    portable,
    render_card,
)
from pipeline.serving.provenance import context_length, max_history_chars, provenance
from pipeline.stage import StageResult

STAGE = "export"


def output_dir(config, fingerprint: str) -> Path:
    return (
        Path(config.export.output_dir or config.workspace.runs_dir / STAGE / fingerprint / "model")
        .expanduser()
        .resolve()
    )


def _choice(config, store):
    """How the shipped checkpoint was chosen: by validation score, or as configured (None then)."""
    from pipeline.serving.export_choice import choose

    return None if config.export.checkpoint is not None else choose(store)


def _choice_rows(choice) -> list[dict]:
    if choice is None:
        return []
    rows = [
        {
            "checkpoint": c.checkpoint_id,
            "stage": c.stage,
            "validation_score": c.score,
            "shipped": c.checkpoint_id == choice.chosen.checkpoint_id,
        }
        for c in (choice.chosen, choice.runner_up)
        if c is not None
    ]
    if choice.base_score is not None:
        rows.append({"checkpoint": "base", "stage": "base", "validation_score": choice.base_score, "shipped": False})
    return rows


def run(config, store) -> StageResult:
    source = resolve_source(config, store)
    choice = _choice(config, store)
    chosen_by = (
        f"shipped by validation score: {choice.words()}"
        if choice is not None
        else f"export.checkpoint {config.export.checkpoint}"
    )
    fmt = resolve_format(config, source)
    if config.export.destination:
        destination_filesystem(config.export.destination)
    fingerprint = stage_fingerprint(config, store, STAGE)
    out_dir = output_dir(config, fingerprint)
    checkpoint_id = f"{STAGE}-{fingerprint}"
    model_name = f"simulacra-world-model-{fingerprint}"
    if (out_dir / METADATA_FILE).is_file() and json.loads((out_dir / METADATA_FILE).read_text())[
        "fingerprint"
    ] == fingerprint:
        action = "already exported"
    else:
        trained_length = context_length(config, source.stage, fmt.name, source.path)
        origin = provenance(config)
        workspace = str(config.workspace.root)
        facts = CardFacts(
            model_name=model_name,
            source_checkpoint=source.checkpoint_id,
            source_stage=source.stage or "folder",
            prompt_format=fmt.name,
            thinking=fmt.thinking,
            context_length=trained_length,
            base_model=origin.base_model,
            license=origin.license,
            license_source=origin.license_source,
            example_request=example_request(fmt, model_name, 256),
            sources=collect_sources(store),
            pools=collect_pools(store),
            stages=collect_stages(config, store),
            evaluation=portable(evaluation_rows(store, source.checkpoint_id), workspace),
            chosen_by=chosen_by,
            fidelity=collect_fidelity(store, source.checkpoint_id),
        )
        metadata = {
            "model_name": model_name,
            "fingerprint": fingerprint,
            "source_checkpoint": source.checkpoint_id,
            "source_stage": source.stage,
            "base_model": origin.base_model,
            "context_length": trained_length,
            "max_history_chars": max_history_chars(config, source.stage, fmt.name),
        }
        # The store's paths stay in the store: a folder copied to another machine names none of this one's.
        card = (
            render_card(facts)
            .replace(str(source.path), f"<local>/{source.path.name}")
            .replace(workspace, "<workspace>")
        )
        write_export(source.path, out_dir, fmt, metadata, card)
        action = "exported"
        # The folder is written, not yet registered: a retry finds it whole and exports nothing again.
        maybe_fail(config, STAGE, f"after writing {out_dir}")
    destination = copy_to(out_dir, config.export.destination) if config.export.destination else None
    metrics = {
        "source_checkpoint": source.checkpoint_id,
        "source_stage": source.stage,
        "prompt_format": fmt.name,
        "thinking": fmt.thinking,
        "model_name": model_name,
        "destination": destination,
        "fingerprint": fingerprint,
        "chosen_by": chosen_by,
        **({"choice": choice.as_dict()} if choice is not None else {}),
    }
    with store.transaction() as tx:
        tx.execute("DELETE FROM checkpoints WHERE checkpoint_id = ?", [checkpoint_id])
        tx.execute(
            "INSERT INTO checkpoints (checkpoint_id, stage, fingerprint, path, base_model, created_at, metrics) "
            "VALUES (?, ?, ?, ?, ?, now(), ?)",
            [checkpoint_id, STAGE, fingerprint, str(out_dir), str(source.path), json.dumps(metrics)],
        )
    copied = f", copied to {destination}" if destination else ""
    summary = f"{action} {source.checkpoint_id} ({fmt.name} format) to {out_dir}{copied}; {chosen_by}"
    return StageResult(
        stage=STAGE,
        metrics=metrics,
        output_path=out_dir,
        summary=summary,
        tables={"export-choice": _choice_rows(choice)} if choice is not None else {},
    )
