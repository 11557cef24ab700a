"""Which checkpoint the export stage exports, and in which prompt format (issue 12, "The checkpoint").

The default is the model the pipeline exists to produce: among the newest registered checkpoint of
each training stage (rl, sft, cpt), the one with the best validation score
(pipeline/serving/export_choice.py), in the prompt and answer format it was trained in.
"""

from dataclasses import dataclass
from pathlib import Path

from pipeline.prompts.answer_format import model_format, recorded_format
from pipeline.serving.prompt_formats import PROMPT_FORMATS, prompt_format


class NothingToExport(RuntimeError):
    """No checkpoint is registered and none is configured."""


@dataclass(frozen=True)
class SourceCheckpoint:
    checkpoint_id: str
    stage: str | None  # None: a folder that is not a registered checkpoint
    path: Path
    base_model: str


def _registered(store, where: str, parameters: list) -> list[SourceCheckpoint]:
    rows = store.rows(
        f"SELECT checkpoint_id, stage, path, base_model FROM checkpoints WHERE {where} ORDER BY created_at DESC, checkpoint_id",
        parameters,
    )
    return [
        SourceCheckpoint(r["checkpoint_id"], r["stage"], Path(r["path"]), r["base_model"] or "")
        for r in rows
        if (Path(r["path"]) / "config.json").is_file()
    ]


def resolve_source(config, store) -> SourceCheckpoint:
    chosen = config.export.checkpoint
    if chosen is not None:
        found = _registered(store, "checkpoint_id = ? OR path = ?", [chosen, str(Path(chosen).expanduser().resolve())])
        if found:
            return found[0]
        path = Path(chosen).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise NothingToExport(
                f"export.checkpoint: {chosen} is neither a registered checkpoint_id nor a model folder"
            )
        return SourceCheckpoint(path.name, None, path, str(path))
    from pipeline.serving.export_choice import choose

    # The best validation score among each training stage's newest checkpoint (pipeline/serving/export_choice.py).
    choice = choose(store)
    if choice is None:
        raise NothingToExport(
            "no checkpoint of rl, sft or cpt is registered: run the training stages first, or set export.checkpoint"
        )
    chosen = choice.chosen
    return SourceCheckpoint(chosen.checkpoint_id, chosen.stage, chosen.path, chosen.base_model)


def resolve_format(config, source: SourceCheckpoint):
    """The checkpoint's template and answer format, as it was trained (`answer_format.json` beside its
    weights, an exported folder's `simulacra.json`, else its stage's: pipeline/prompts/answer_format.py's
    `model_format`); `export.prompt_format` names another template, in the same answer format."""
    trained = recorded_format(source.path) or (
        model_format(None, source.stage) if source.stage in PROMPT_FORMATS else None
    )
    name = config.export.prompt_format or (trained.template if trained else None)
    if name is None or name not in PROMPT_FORMATS:
        raise NothingToExport(
            f"export.prompt_format: the checkpoint {source.checkpoint_id} was trained in no known prompt format "
            f"(stage {source.stage}); set export.prompt_format to one of {', '.join(PROMPT_FORMATS)}"
        )
    try:
        return prompt_format(name, trained.thinking if trained else None)
    except ValueError as exc:  # the cpt template for a checkpoint trained thinking
        raise NothingToExport(
            f"export.prompt_format: {exc}, and the checkpoint {source.checkpoint_id} was trained "
            "to answer thinking: choose sft or rl"
        ) from None
