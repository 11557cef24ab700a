"""SWE-agent `.traj` files: `{environment, trajectory: [steps], history: [messages], info}`.

Turns come from `trajectory`: each step's `action` (the command as SWE-agent ran it) and
`observation` (the environment's raw output, without the prompt suffix the history adds); the
step's thought, response and state go to turn metadata. The tool name is the function the model
called where the run used function calling (looked up in `history` by the action text), else the
interface command the action starts with (`edit`, `find_file`, as the system prompt lists them),
else `bash`: SWE-agent runs any other action in its shell.

Files with only `history` (function_calling_simple.traj) pair each assistant message carrying an
`action` or `tool_calls` with the next `role: "tool"` message or `message_type: "observation"`
message.

From `history`: the system message describes the interface's commands -> system.action_space;
demonstration messages (`is_demo`) -> system.demonstrations; the first other user message (the
issue and instructions) -> task. info.exit_status and info.submission go to metadata. Domain swe.
"""

import json
import re
from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.formats.tool_calls import parse_arguments, render_call
from pipeline.store.schema import RecordError, SystemPrompt, Trajectory, Turn, as_text, require_object, require_text

COMMAND_LINE = re.compile(r"([a-z_][a-z0-9_]*)\b")


class Adapter(FormatAdapter):
    name = "swe-agent"
    default_domain = "swe"
    description = "SWE-agent `.traj` JSON (`trajectory` steps and/or chat `history`)."

    def detect(self, content: Any) -> bool:
        if not isinstance(content, dict):
            return False
        history = content.get("history")
        if isinstance(content.get("trajectory"), list) and isinstance(history, list):
            return True
        # The history-only variant: chat messages tagged with SWE-agent's agent / message type.
        return (
            isinstance(history, list)
            and bool(history)
            and all(isinstance(m, dict) and "role" in m for m in history)
            and any("message_type" in m or "agent" in m for m in history)
        )

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        history = record.get("history") or []
        if not isinstance(history, list):
            raise RecordError("history: expected a list of messages")
        for index, message in enumerate(history):
            if not isinstance(message, dict):
                raise RecordError(f"history[{index}]: expected a message object, got {type(message).__name__}")
        steps = record.get("trajectory")
        if steps is not None and not isinstance(steps, list):
            raise RecordError(f"trajectory: expected a list of steps, got {type(steps).__name__}")
        # Demonstration messages are another run's turns, shown to the agent: not this run's.
        demos = [m for m in history if m.get("is_demo")]
        history = [m for m in history if not m.get("is_demo")]
        system = [m for m in history if m.get("role") == "system"]
        action_space = "\n\n".join(as_text(m.get("content")) for m in system) or None
        commands = interface_commands(action_space or "")
        if steps:
            turns, unanswered = _step_turns(steps, _called_functions(history), commands), 0
        else:
            turns, unanswered = _history_turns(history, commands)
        if not turns:
            raise RecordError("no environment actions: neither `trajectory` steps nor actions in `history`")

        task = next((m for m in history if m.get("role") == "user"), None)
        info = record.get("info") or {}
        require_object(info, "info")
        metadata: dict[str, Any] = {key: info[key] for key in ("exit_status", "submission") if key in info}
        metadata["unanswered_actions"] = unanswered
        if (instance := _instance_id(record)) is not None:
            metadata["instance_id"] = instance
        return Trajectory(
            source="",
            domain=domain or self.default_domain,
            turns=turns,
            system=SystemPrompt(
                action_space=action_space,
                demonstrations="\n\n".join(as_text(m.get("content")) for m in demos) or None,
            ),
            task=None if task is None else as_text(task.get("content")),
            metadata=metadata,
            format=self.name,
        )


def _instance_id(record: dict[str, Any]) -> str | None:
    """The SWE-bench instance a replayed run solved, where the file records it (`replay_config.problem_statement.id`,
    a mapping or its JSON text): the split groups runs by it (`metadata.instance_id`), where their task texts, the
    issue wrapped in each configuration's instructions, differ from one configuration to the next."""
    replay = record.get("replay_config")
    if isinstance(replay, str):
        try:
            replay = json.loads(replay)
        except ValueError:
            return None
    statement = replay.get("problem_statement") if isinstance(replay, dict) else None
    instance = statement.get("id") if isinstance(statement, dict) else None
    return (instance.strip() or None) if isinstance(instance, str) else None


def _called_functions(history: list[dict[str, Any]]) -> dict[str, str]:
    """Action text -> the function the model called for it, in function-calling runs."""
    called = {}
    for message in history:
        calls = message.get("tool_calls")
        if isinstance(message.get("action"), str) and isinstance(calls, list) and len(calls) == 1:
            function = calls[0].get("function") if isinstance(calls[0], dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                called[message["action"]] = function["name"]
    return called


def interface_commands(system_prompt: str) -> set[str]:
    """The special commands a classic SWE-agent system prompt lists under `COMMANDS:`. Both of its
    layouts (`name:` followed by an indented docstring, or `name <args> - doc`) start each command
    at column 0 with its lower-case name; the section ends at the next capitalised line."""
    _, found, section = system_prompt.partition("COMMANDS:\n")
    commands = {"submit"} if found else set()
    for line in section.splitlines():
        if line[:1].isupper():
            break
        if (match := COMMAND_LINE.match(line)) is not None:
            commands.add(match.group(1))
    return commands


def _tool_name(action: str, called: dict[str, str], commands: set[str]) -> str | None:
    """The function a function-calling run called; else the interface command the action starts
    with; else `bash`, where SWE-agent runs every other action."""
    if action in called:
        return called[action]
    words = action.split(maxsplit=1)
    if not words:
        return None
    return words[0] if words[0] in commands else "bash"


def _step_turns(steps: list[Any], called: dict[str, str], commands: set[str]) -> list[Turn]:
    turns = []
    for index, step in enumerate(steps):
        where = f"trajectory[{index}]"
        require_object(step, where)
        action = require_text(step.get("action"), f"{where}.action")
        observation = require_text(step.get("observation"), f"{where}.observation")
        metadata = {key: step[key] for key in ("thought", "response", "execution_time") if step.get(key) is not None}
        state = step.get("state")
        if isinstance(state, str):
            # Older SWE-agent writes the state as a JSON string; newer as an object.
            try:
                state = json.loads(state)
            except json.JSONDecodeError:
                pass
        if state:
            metadata["state"] = state
        tool_name = _tool_name(action, called, commands)
        turns.append(Turn(action=action, observation=observation, tool_name=tool_name, metadata=metadata))
    return turns


def _history_turns(history: list[dict[str, Any]], commands: set[str]) -> tuple[list[Turn], int]:
    """Turns of a history-only file, and how many actions the history leaves unanswered at its end."""
    turns: list[Turn] = []
    pending: tuple[Turn, str] | None = None  # an action waiting for its observation, and where it is
    for index, message in enumerate(history):
        where = f"history[{index}]"
        role = message.get("role")
        if role == "assistant" and ("action" in message or message.get("tool_calls")):
            if pending is not None:
                raise RecordError(f"{pending[1]}: no observation before the next action at {where}")
            pending = (_history_action(message, where, commands), where)
        elif pending is not None and (role == "tool" or message.get("message_type") == "observation"):
            turn, _ = pending
            turn.observation = as_text(message.get("content"))
            turns.append(turn)
            pending = None
    return turns, int(pending is not None)


def _history_action(message: dict[str, Any], where: str, commands: set[str]) -> Turn:
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RecordError(f"{where}.tool_calls: expected a list, got {type(calls).__name__}")
    if len(calls) > 1:
        # SWE-agent runs one command per step; a second call would have no observation of its own.
        raise RecordError(f"{where}.tool_calls: expected one call, got {len(calls)}")
    metadata = {"thought": message["thought"]} if isinstance(message.get("thought"), str) else {}
    if not calls:
        action = require_text(message.get("action"), f"{where}.action")
        return Turn(action=action, observation="", tool_name=_tool_name(action, {}, commands), metadata=metadata)
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    if not isinstance(function, dict):
        raise RecordError(f"{where}.tool_calls[0].function: expected an object")
    name = require_text(function.get("name"), f"{where}.tool_calls[0].function.name")
    arguments = parse_arguments(function.get("arguments"), f"{where}.tool_calls[0].function.arguments")
    # SWE-agent's own rendering of the call (`find_file missing_colon.py`) where it wrote one.
    action = message["action"] if isinstance(message.get("action"), str) else render_call(name, arguments)
    return Turn(action=action, observation="", tool_name=name, metadata=metadata)
