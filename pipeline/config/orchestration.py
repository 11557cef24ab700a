"""Configuration of how `simulacra run` and the Prefect flows chain the stages."""

from pydantic import Field

from pipeline.config.base import Section

STAGE_ORDER = ("ingest", "filter", "score", "split", "cpt")


class OrchestrationConfig(Section):
    stages: list[str] = Field(
        default_factory=lambda: list(STAGE_ORDER),
        description="Stages `simulacra run` executes, in DAG order. A stage left out is not run; its "
        "downstream stages still read whatever the store holds.",
    )
    fail_stage: str | None = Field(
        default=None,
        description="Fault hook for resume tests and drills: the named stage raises after persisting part of "
        "its work. Never set it in production.",
    )
