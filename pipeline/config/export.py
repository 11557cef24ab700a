"""Configuration of the export stage: which checkpoint becomes the world-model checkpoint, and where
a copy goes (issue 12, "The checkpoint")."""

from pathlib import Path

from pydantic import Field

from pipeline.config.base import Section


class ExportConfig(Section):
    checkpoint: str | None = Field(
        default=None,
        description="The checkpoint to export: a checkpoint_id of the `checkpoints` table or a model folder. "
        "None: the newest checkpoint of the last training stage that ran (rl, else sft, else cpt), the model "
        "the pipeline exists to produce.",
    )
    prompt_format: str | None = Field(
        default=None,
        description="The prompt format written into the export (cpt: non-thinking, CPT's template; sft: thinking, "
        "SFT's first template). None: the format of the stage that trained the checkpoint, the one it answers best.",
    )
    license: str | None = Field(
        default=None,
        description="The licence in the model card's front matter (a Hub licence id: apache-2.0, llama3.1, ...). "
        "None: the base model's own card's licence (read from its local folder or the Hugging Face cache), the "
        "project's apache-2.0 for the tiny offline model it builds, else `other`. A fine-tuned model keeps its base "
        "model's licence, so set this only when the base model's card cannot be read here.",
    )
    output_dir: Path | None = Field(
        default=None,
        description="Where the exported folder is written. None: <workspace>/runs/export/<fingerprint>/model.",
    )
    destination: str | None = Field(
        default=None,
        description="An fsspec URL the finished folder is copied to (s3://bucket/models/wm, gs://..., file:///srv/wm, "
        "a local path), so GPU nodes and inference servers read it from object storage. None: no copy. Remote "
        "schemes need their fsspec package (s3fs, gcsfs) and credentials from the environment.",
    )
