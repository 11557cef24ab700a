"""The project's own JSONL: one unified-schema trajectory per line.

This is the format `simulacra` writes (demo corpus, exports, benchmarks), and the fast path of
ingestion: fields map one to one, so parsing is a few dictionary look-ups per turn.
"""

from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.store.schema import RecordError, SystemPrompt, Trajectory, Turn, require_text

SCHEMA_TAG = "simulacra/trajectory-v1"


def to_record(trajectory: Trajectory) -> dict[str, Any]:
    """The JSONL record for a trajectory (inverse of `Adapter.parse`)."""
    s = trajectory.system
    return {
        "schema": SCHEMA_TAG,
        "domain": trajectory.domain,
        "task": trajectory.task,
        "system": {
            "task_description": s.task_description,
            "action_space": s.action_space,
            "tools": s.tools,
            "initial_state": s.initial_state,
            "demonstrations": s.demonstrations,
            "simulation_instructions": s.simulation_instructions,
        },
        "turns": [
            {
                "action": t.action,
                "observation": t.observation,
                "tool_name": t.tool_name,
                "is_error": t.is_error,
                **({"metadata": t.metadata} if t.metadata else {}),
            }
            for t in trajectory.turns
        ],
        "outcome_reward": trajectory.outcome_reward,
        "metadata": trajectory.metadata,
    }


def _optional_text(value: Any, what: str) -> str | None:
    return None if value is None else require_text(value, what)


class Adapter(FormatAdapter):
    name = "simulacra-jsonl"
    default_domain = "other"
    description = "The unified schema, one trajectory per JSONL line (`schema: simulacra/trajectory-v1`)."

    def detect(self, content: Any) -> bool:
        return isinstance(content, dict) and content.get("schema") == SCHEMA_TAG

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        raw_turns = record.get("turns")
        if not isinstance(raw_turns, list):
            raise RecordError("`turns`: expected a list")
        turns = []
        for index, raw in enumerate(raw_turns):
            # Exact type checks inline: this loop runs once per turn of every ingested trajectory.
            if type(raw) is not dict:
                raise RecordError(f"turns[{index}]: expected an object, got {type(raw).__name__}")
            action = raw.get("action")
            observation = raw.get("observation")
            if type(action) is not str or type(observation) is not str:
                require_text(action, f"turns[{index}].action")
                require_text(observation, f"turns[{index}].observation")
            tool_name = raw.get("tool_name")
            if tool_name is not None and type(tool_name) is not str:
                raise RecordError(f"turns[{index}].tool_name: expected a string, got {type(tool_name).__name__}")
            is_error = raw.get("is_error", False)
            if type(is_error) is not bool:
                raise RecordError(f"turns[{index}].is_error: expected a boolean, got {type(is_error).__name__}")
            metadata = raw.get("metadata") or {}
            if type(metadata) is not dict:
                raise RecordError(f"turns[{index}].metadata: expected an object")
            turns.append(Turn(action, observation, tool_name, is_error, metadata))  # type: ignore[arg-type]  # both str: require_text raised otherwise
        system = record.get("system") or {}
        if not isinstance(system, dict):
            raise RecordError("`system`: expected an object")
        tools = system.get("tools") or []
        if not isinstance(tools, list):
            raise RecordError("`system.tools`: expected a list of tool schemas")
        reward = record.get("outcome_reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise RecordError(f"`outcome_reward`: expected a number, got {type(reward).__name__}")
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise RecordError("`metadata`: expected an object")
        return Trajectory(
            source="",
            domain=domain or require_text(record.get("domain", self.default_domain), "domain"),
            task=_optional_text(record.get("task"), "task"),
            system=SystemPrompt(
                task_description=_optional_text(system.get("task_description"), "system.task_description") or "",
                action_space=_optional_text(system.get("action_space"), "system.action_space"),
                tools=tools,
                initial_state=_optional_text(system.get("initial_state"), "system.initial_state"),
                demonstrations=_optional_text(system.get("demonstrations"), "system.demonstrations"),
                simulation_instructions=_optional_text(
                    system.get("simulation_instructions"), "system.simulation_instructions"
                ),
            ),
            turns=turns,
            outcome_reward=None if reward is None else float(reward),
            metadata=metadata,
            format=self.name,
        )
