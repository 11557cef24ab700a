"""Configuration of `simulacra ingest`: where trajectories come from and what a malformed record is."""

from typing import Literal

from pydantic import Field

from pipeline.config.base import Section

Domain = Literal["terminal", "swe", "mcp", "search", "web", "android", "os", "text-game", "other"]


class FieldMapping(Section):
    """How a generic JSONL record maps onto the unified schema (dotted paths into the record)."""

    turns: str = Field(description="Path to the list of turns in each record, e.g. `steps`.")
    action: str = Field(description="Path, inside one turn, to the action text, e.g. `command`.")
    observation: str = Field(description="Path, inside one turn, to the observation text, e.g. `output`.")
    tool_name: str | None = Field(default=None, description="Path, inside one turn, to the tool name, if any.")
    task: str | None = Field(default=None, description="Path to the task text in the record, if any.")
    system_prompt: str | None = Field(
        default=None, description="Path to a system prompt; it becomes the task description part."
    )
    outcome_reward: str | None = Field(default=None, description="Path to a numeric outcome reward, if any.")
    id: str | None = Field(
        default=None, description="Path to the record's own id; kept as metadata (the store's id is a content hash)."
    )


class SourceConfig(Section):
    name: str = Field(description="Name the source is recorded under in `sources`, `quarantine` and stats.")
    path: str = Field(description="File, folder, glob, or `hf://dataset[:split]` to read.")
    format: str | None = Field(
        default=None, description="Adapter name to force (see `simulacra formats`); None detects per file."
    )
    domain: Domain | None = Field(
        default=None,
        description="Domain of every trajectory from this source; None lets the adapter infer it "
        "(bash tool -> terminal, SWE-agent -> swe, tool-call chats -> mcp).",
    )
    field_mapping: FieldMapping | None = Field(
        default=None, description="Required for the `generic-jsonl` format: where each schema field is."
    )


class IngestConfig(Section):
    sources: list[SourceConfig] = Field(
        default_factory=list,
        description="Sources read by `simulacra run` and the nightly refresh. `simulacra ingest PATH` reads "
        "its arguments instead.",
    )
    max_observation_chars: int | None = Field(
        default=200_000,
        ge=1,
        description="An observation longer than this quarantines its trajectory: such pages (whole "
        "accessibility dumps, binary cat output) cannot fit any training window. None disables the cap.",
    )
    max_action_chars: int | None = Field(
        default=50_000, ge=1, description="The same cap for actions. None disables it."
    )
    max_raw_chars_quarantined: int = Field(
        default=20_000,
        ge=0,
        description="How much of a malformed record's raw text is kept in `quarantine.raw`: enough to debug, "
        "not enough to bloat the store with a multi-megabyte bad line.",
    )
    sql_fast_path: bool = Field(
        default=True,
        description="Read `simulacra-jsonl` files through DuckDB in bulk (checks and extraction in SQL; any "
        "line it cannot vouch for goes through the Python adapter, so results are the same). False reads "
        "every record through the Python adapter: slower, for debugging or comparison.",
    )
    batch_trajectories: int = Field(
        default=20_000,
        ge=1,
        description="Trajectories buffered before one write transaction. Larger batches are faster; a "
        "killed run loses at most one uncommitted batch, which the next run re-reads.",
    )
