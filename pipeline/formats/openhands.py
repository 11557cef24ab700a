"""OpenHands event streams: a JSON list of events (or `{"history": [events]}`, as its evaluation
output writes them).

An action event has `action`, `args` and, when the model called a tool, `tool_call_metadata`; an
observation event has `observation`, `content`, `extras` and `cause`, the id of the action it
answers. Environment actions are the agent's actions other than conversation and control
(`message`, `system`, `finish`, `recall`, `change_agent_state`, `reject`): each is a turn joined
to its observation by `cause`. An environment action no observation answers is skipped and
counted in metadata["unanswered_actions"] (the event stream is asynchronous: a run stopped
mid-command leaves one). Unlike the other adapters, one before answered actions is not a hole that
quarantines the record: OpenHands answers a delegate's action without `cause` and never answers a
condensation, so a missing observation is no evidence of a gap in the history.

Action text: the command for `run`, the code for `run_ipython`, the URL or browser actions for
`browse` / `browse_interactive`; otherwise the tool call as the model wrote it (function name and
the arguments from the recorded model response, rendered as in tool_calls.py), falling back to
the event's own args. tool_name: the called function, else the action type.

A `think` action is a thought (metadata kind `thought`, schema.THOUGHT): OpenHands does not run it,
it answers "Your thought has been logged." itself (runtime/base.py). It stays in the history but is
never a target.

The first user message is the task; a `system` action's prompt goes to
metadata["agent_system_prompt"] and its `tools` to system.tools. A conversation with no
environment action (only messages) has no turns: a RecordError, so it is quarantined with that
reason. Domain swe.
"""

from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.formats.tool_calls import parse_arguments, render_call
from pipeline.store.schema import (
    THOUGHT,
    RecordError,
    SystemPrompt,
    Trajectory,
    Turn,
    as_text,
    require_object,
    require_text,
)

NOT_ENVIRONMENT = {"message", "system", "finish", "recall", "change_agent_state", "reject"}
# Actions whose readable form is one of their args.
COMMAND_ARG = {"run": "command", "run_ipython": "code", "browse": "url", "browse_interactive": "browser_actions"}
# Args that are OpenHands bookkeeping, not part of what the agent asked for.
BOOKKEEPING_ARGS = {
    "thought",
    "impl_source",
    "translated_ipython_code",
    "security_risk",
    "confirmation_state",
    "is_confirmed",
    "hidden",
    "blocking",
    "is_input",
    "keep_prompt",
    "wait_for_response",
    "timeout",
}


def _is_event(value: Any) -> bool:
    return isinstance(value, dict) and "id" in value and ("action" in value or "observation" in value)


class Adapter(FormatAdapter):
    name = "openhands"
    default_domain = "swe"
    description = "OpenHands event list (actions joined to observations by `cause`)."

    def detect(self, content: Any) -> bool:
        if isinstance(content, dict):
            content = content.get("history")
        return isinstance(content, list) and bool(content) and _is_event(content[0])

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        metadata: dict[str, Any] = {}
        where = "events"
        if isinstance(record, dict):
            metadata.update({key: record[key] for key in ("instance_id",) if key in record})
            record, where = record.get("history"), "history"
        if not isinstance(record, list):
            raise RecordError(f"{where}: expected a list of events, got {type(record).__name__}")
        for index, event in enumerate(record):
            if not isinstance(event, dict):
                raise RecordError(f"{where}[{index}]: expected an event object, got {type(event).__name__}")
        answers = {
            event["cause"]: event for event in record if "observation" in event and event.get("cause") is not None
        }

        turns: list[Turn] = []
        task: str | None = None
        tools: list[Any] = []
        skipped: dict[str, int] = {}
        unanswered = 0
        for index, event in enumerate(record):
            if "action" not in event:
                continue
            kind = require_text(event["action"], f"{where}[{index}].action")
            args = event.get("args") or {}
            require_object(args, f"{where}[{index}].args")
            if kind == "message" and event.get("source") == "user" and task is None:
                task = as_text(args.get("content", event.get("message")))
                continue
            if kind == "system":
                metadata["agent_system_prompt"] = as_text(args.get("content"))
                tools = args.get("tools") or []
                if not isinstance(tools, list):
                    raise RecordError(f"{where}[{index}].args.tools: expected a list of tool schemas")
                continue
            if kind in NOT_ENVIRONMENT:
                skipped[kind] = skipped.get(kind, 0) + 1
                continue
            observation = answers.get(event.get("id"))
            if observation is None:
                unanswered += 1
                continue
            turns.append(_turn(event, kind, args, observation, f"{where}[{index}]"))
        if not turns:
            counted = ", ".join(f"{n} {kind}" for kind, n in sorted(skipped.items())) or "none"
            raise RecordError(f"no environment actions: {len(record)} events, skipped actions: {counted}")
        metadata.update({"skipped_actions": skipped, "unanswered_actions": unanswered})
        return Trajectory(
            source="",
            domain=domain or self.default_domain,
            turns=turns,
            system=SystemPrompt(tools=tools),
            task=task,
            metadata=metadata,
            format=self.name,
        )


def _turn(event: dict[str, Any], kind: str, args: dict[str, Any], answer: dict[str, Any], where: str) -> Turn:
    call = event.get("tool_call_metadata") or {}
    if not isinstance(call, dict):
        raise RecordError(f"{where}.tool_call_metadata: expected an object")
    function = call.get("function_name")
    if function is not None and not isinstance(function, str):
        raise RecordError(f"{where}.tool_call_metadata.function_name: expected a string")
    command = args.get(COMMAND_ARG[kind]) if kind in COMMAND_ARG else None
    if isinstance(command, str):
        action = command
    else:
        arguments = _model_arguments(call, where)
        if arguments is None:
            arguments = {k: v for k, v in args.items() if k not in BOOKKEEPING_ARGS}
        action = render_call(function or kind, arguments)

    extras = answer.get("extras") or {}
    if not isinstance(extras, dict):
        raise RecordError(f"{where}: its observation's extras: expected an object")
    exit_code = extras.get("exit_code")
    if exit_code is None and isinstance(extras.get("metadata"), dict):
        exit_code = extras["metadata"].get("exit_code")
    metadata: dict[str, Any] = {"observation_type": answer.get("observation")}
    if kind == "think":
        metadata["kind"] = THOUGHT
    if isinstance(args.get("thought"), str) and args["thought"]:
        metadata["thought"] = args["thought"]
    if isinstance(exit_code, int):
        metadata["exit_code"] = exit_code
    # OpenHands writes exit code -1 when a command had not finished when the turn ended: unknown,
    # not a failure.
    failed = isinstance(exit_code, int) and exit_code not in (0, -1)
    return Turn(
        action=action,
        observation=as_text(answer.get("content")),
        tool_name=function or kind,
        is_error=answer.get("observation") == "error" or failed,
        metadata=metadata,
    )


def _model_arguments(call: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The arguments the model sent for this call, from the model response OpenHands recorded."""
    response = call.get("model_response")
    call_id = call.get("tool_call_id")
    if not isinstance(response, dict) or call_id is None:
        return None
    for choice in response.get("choices") or []:
        message = choice.get("message") if isinstance(choice, dict) else None
        for tool_call in (message or {}).get("tool_calls") or []:
            if isinstance(tool_call, dict) and tool_call.get("id") == call_id:
                function = tool_call.get("function") or {}
                return parse_arguments(function.get("arguments"), f"{where}.tool_call_metadata.model_response")
    return None
