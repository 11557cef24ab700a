"""The unified trajectory schema every format adapter produces.

A trajectory is one interaction between an agent and an environment: a system prompt in the five
parts of SPEC.md, then (action, observation) turns in order. Its id is a content hash of the
normalised form, so the same trajectory read twice, from the same file or another, is one row.
"""

import hashlib
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import orjson

DOMAINS = ("terminal", "swe", "mcp", "search", "web", "android", "os", "text-game", "other")
# metadata["kind"] of a turn whose action is the agent thinking aloud (ReAct's `think: ...`): the
# harness answers it ("OK.") without the environment, so it is history for the turns after it but
# never a prediction target: keep ratio 0 in CPT (score stage), never an SFT / RL / eval target
# (split stage).
THOUGHT = "thought"


class RecordError(ValueError):
    """A record that cannot become a trajectory; the message is the quarantine reason."""


@dataclass(slots=True)
class Turn:
    action: str
    observation: str
    tool_name: str | None = None
    is_error: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class SystemPrompt:
    """SPEC.md's five parts. Only the task description is always present."""

    task_description: str = ""
    action_space: str | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)
    initial_state: str | None = None
    demonstrations: str | None = None
    simulation_instructions: str | None = None

    def tool_names(self) -> set[str]:
        names = set()
        for tool in self.tools:
            spec = tool.get("function", tool) if isinstance(tool, dict) else {}
            if isinstance(spec, dict) and isinstance(spec.get("name"), str):
                names.add(spec["name"])
        return names


@dataclass(slots=True)
class Trajectory:
    source: str
    domain: str
    turns: list[Turn]
    system: SystemPrompt = field(default_factory=SystemPrompt)
    task: str | None = None
    outcome_reward: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    format: str = ""
    location: str = ""

    def content_id(self) -> str:
        """Hash of what the trajectory says, not where it came from: source, location, format and
        metadata (timestamps, run ids) are left out so a re-export of the same run deduplicates.

        SHA-256 (first 128 bits, hex) of `content_header`, then the turns column by column: the
        UTF-8 byte lengths of every action, observation and tool name (-1 for none) and every
        error flag (0/1) as little-endian int64, then all actions, all observations and all tool
        names. Length-prefixed, so no two trajectories share the text; column by column, so the SQL
        fast path of ingestion (pipeline/formats/simulacra_jsonl_sql.py) hashes DuckDB's Arrow
        buffers as they come, without building the text. Both must change together."""
        try:
            actions = [t.action.encode("utf-8") for t in self.turns]
            observations = [t.observation.encode("utf-8") for t in self.turns]
            tool_names = [b"" if t.tool_name is None else t.tool_name.encode("utf-8") for t in self.turns]
            header = content_header(self).encode("utf-8")
        except UnicodeEncodeError as exc:
            # A lone surrogate (from a lenient decoder upstream) is text that cannot be valid UTF-8.
            raise RecordError(f"not valid UTF-8 text: {exc}") from None
        lengths = (
            [len(a) for a in actions]
            + [len(o) for o in observations]
            + [-1 if t.tool_name is None else len(n) for t, n in zip(self.turns, tool_names)]
            + [int(t.is_error) for t in self.turns]
        )
        digest = hashlib.sha256(header)
        digest.update(struct.pack(f"<{len(lengths)}q", *lengths))
        for column in (actions, observations, tool_names):
            digest.update(b"".join(column))
        return digest.hexdigest()[:CONTENT_ID_CHARS]


# 128 bits of SHA-256 in hex: collisions are out of reach for any corpus, and ids stay short.
CONTENT_ID_CHARS = 32


def content_header(trajectory: "Trajectory") -> str:
    """The system prompt's parts (tool schemas in canonical JSON), the task and the number of turns,
    as self-delimiting fields."""
    s = trajectory.system
    parts = (
        canonical_tools(s.tools),
        trajectory.task,
        s.task_description,
        s.action_space,
        s.initial_state,
        s.demonstrations,
        s.simulation_instructions,
    )
    return "".join(content_field(part) for part in parts) + f"N{len(trajectory.turns)}:"


def content_field(value: str | None) -> str:
    """`N` for a missing field, else `S<length in UTF-8 bytes>:<text>`."""
    if value is None:
        return "N"
    size = len(value) if value.isascii() else len(value.encode("utf-8"))
    return f"S{size}:{value}"


def canonical_tools(tools: list[Any]) -> str | None:
    """The tool schemas as hashed: minified JSON with sorted keys, so key order does not change the
    id. None when there are none. Raises RecordError for what JSON cannot hold."""
    if not tools:
        return None
    try:
        return orjson.dumps(tools, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError as exc:
        # orjson refuses lone surrogates: text that cannot be valid UTF-8 is caught here.
        raise RecordError(f"not valid UTF-8 text: {exc}") from None


def require_text(value: Any, what: str) -> str:
    """Text fields must be strings; numbers and None are a schema error, not something to coerce."""
    if not isinstance(value, str):
        raise RecordError(f"{what}: expected a string, got {type(value).__name__}")
    return value


def require_object(value: Any, what: str) -> dict[str, Any]:
    """A JSON object where the format has one; a list or a string there is a schema error."""
    if not isinstance(value, dict):
        raise RecordError(f"{what}: expected an object, got {type(value).__name__}")
    return value


def as_text(value: Any) -> str:
    """Render structured content (a dict observation, a list of content parts) as text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and "text" in p for p in value):
        return "".join(str(p["text"]) for p in value)
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# orjson writes JSON up to 255 levels deep; metadata deeper than this is no run's record of itself.
METADATA_DEPTH = 200


def storable_metadata(trajectory: Trajectory) -> None:
    """Make the trajectory's and its turns' metadata what the store's JSON columns hold, in place: a harness's
    metadata is copied as it was read, and YAML or a JSON parser can give what JSON cannot write (an integer past
    64 bits, a set, bytes). Such values are kept as text; metadata nested deeper than `METADATA_DEPTH` raises
    RecordError (the record is quarantined, where the write would have failed the whole batch)."""
    trajectory.metadata = _storable(trajectory.metadata, "metadata")
    for number, turn in enumerate(trajectory.turns):
        if turn.metadata:
            turn.metadata = _storable(turn.metadata, f"turn {number}'s metadata")


def _storable(value: dict[str, Any], what: str) -> dict[str, Any]:
    try:
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
        return value
    except orjson.JSONEncodeError:
        return _plain(value, what, 0)


def _plain(value: Any, what: str, depth: int) -> Any:
    if depth > METADATA_DEPTH:
        raise RecordError(f"{what} is nested deeper than {METADATA_DEPTH} levels")
    if isinstance(value, dict):
        return {key if isinstance(key, str) else str(key): _plain(item, what, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item, what, depth + 1) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(item, what, depth + 1) for item in value), key=str)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "backslashreplace")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return str(value)
    try:
        orjson.dumps(value)
        return value
    except orjson.JSONEncodeError:
        return str(value)


def check_limits(trajectory: Trajectory, max_action_chars: int | None, max_observation_chars: int | None) -> None:
    """Raise RecordError for what the store must not hold: no turns, an unknown domain, or an
    action/observation above its size cap. (Invalid UTF-8 is caught by `content_id`.)"""
    if not trajectory.turns:
        raise RecordError("no turns: the record holds no (action, observation) pair")
    if trajectory.domain not in DOMAINS:
        raise RecordError(f"domain {trajectory.domain!r} is not one of {', '.join(DOMAINS)}")
    for index, turn in enumerate(trajectory.turns):
        if max_action_chars is not None and len(turn.action) > max_action_chars:
            raise RecordError(f"turn {index}: action of {len(turn.action)} chars exceeds the cap of {max_action_chars}")
        if max_observation_chars is not None and len(turn.observation) > max_observation_chars:
            raise RecordError(
                f"turn {index}: observation of {len(turn.observation)} chars exceeds the cap of {max_observation_chars}"
            )


@dataclass(frozen=True, slots=True)
class ScoredTurn:
    """A kept turn as training reads it: its text, its informativeness category and the share of its
    observation tokens that carry loss (`keep_ratio`, SPEC.md's table)."""

    turn_index: int
    action: str
    observation: str
    category: str
    keep_ratio: float


def system_prompt_from_row(row: dict[str, Any]) -> SystemPrompt:
    """A SystemPrompt from a `trajectories` row (or its Parquet snapshot), tools still JSON text."""
    tools = row.get("tools")
    return SystemPrompt(
        task_description=row.get("task_description") or "",
        action_space=row.get("action_space"),
        tools=json.loads(tools) if isinstance(tools, str) and tools else (tools or []),
        initial_state=row.get("initial_state"),
        demonstrations=row.get("demonstrations"),
        simulation_instructions=row.get("simulation_instructions"),
    )
