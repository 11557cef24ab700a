"""Harbor's Agent Trajectory Interchange Format (ATIF v1.x): one JSON object per run.

`{schema_version: "ATIF-v1.x", session_id, agent, steps: [{step_id, source, message,
reasoning_content, tool_calls: [{tool_call_id, function_name, arguments}],
observation: {results: [{source_call_id, content}]}}]}`. An agent step holds its actions and
their observations together: each tool call is a turn, answered by the result whose
`source_call_id` is the call's id, or, for results without one, by the next result in order.
Harbor's Terminus-2 sends several keystrokes in one step and records the terminal's one answer
to all of them as a single result without `source_call_id` (terminus_2.py: "the observation
applies to the entire step"): such a step (several calls, one result, no id) is one turn whose
action is its calls, one rendered call per line.

An agent step with results but no tool calls is either a reply the harness rejected or a harness
that parses commands out of the message. Terminus-2 answers a reply that is not its JSON (or
XML) schema with "Previous response had parsing errors: ..." and asks again; the reply never
reached the terminal, so that step is a format-error turn (`is_error`, metadata `kind:
format_error`, the reply as its action), which the filter drops as a retry cycle. Any other such
step (Terminus-2's `raw_content` mode, OpenHands without function calling, as Harbor's golden
trajectories show) is one turn whose action is the message. The warnings Terminus-2 writes
before the terminal's answer when a reply parsed with warnings ("Previous response had
warnings:\nWARNINGS: - Extra text detected before JSON object\n\n...") judge the reply, not the
environment: they move from the observation to metadata["reply_warnings"].

The first user step is the task; later user steps are skipped and counted. A system step is the
agent's prompt (metadata["agent_system_prompt"]). A call without a result is skipped and counted
when no answered action follows (the run ended there); one followed by answered actions, in its
own step or a later one, leaves a hole in their history and quarantines the record (as in the
openai-chat adapter).

Domain: terminal when a call's name is a shell (bash, terminal, execute, ...; see domains.py),
else the tools' signature, else mcp.
"""

import re
from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.formats.domains import domain_of_tools
from pipeline.formats.tool_calls import parse_arguments, render_call
from pipeline.store.schema import RecordError, SystemPrompt, Trajectory, Turn, as_text, require_object, require_text

SOURCES = {"system", "user", "agent"}
# How Terminus-2 answers a reply it could not parse (Harbor, agents/terminus_2/terminus_2.py; its
# golden hello-world-invalid-json.trajectory.json): "Previous response had parsing
# errors:\nERROR: Missing required fields: analysis, plan\n...".
REJECTED_REPLY = re.compile(r"^Previous response had parsing errors:")
# Terminus-2 runs a reply that parsed with warnings, and puts the warnings before the terminal's
# answer (terminus_2.py: "Previous response had warnings:\n{feedback}\n\n{terminal output}"). They
# are about the reply's format, not the environment's answer: they move to metadata.
REPLY_WARNINGS = re.compile(r"^Previous response had warnings:\n(WARNINGS: .*?)\n\n", re.DOTALL)


class Adapter(FormatAdapter):
    name = "atif"
    default_domain = "mcp"
    description = "Harbor ATIF v1.x (`schema_version: ATIF-v1.x`, `steps` with tool calls and observations)."

    def detect(self, content: Any) -> bool:
        return (
            isinstance(content, dict)
            and isinstance(content.get("schema_version"), str)
            and content["schema_version"].startswith("ATIF-")
            and isinstance(content.get("steps"), list)
        )

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        steps = record.get("steps")
        if not isinstance(steps, list):
            raise RecordError("steps: expected a list")
        turns: list[Turn] = []
        task: str | None = None
        system_prompts: list[str] = []
        skipped_user = unanswered = 0
        gap: str | None = None  # the first step with a call no result answers
        for index, step in enumerate(steps):
            where = f"steps[{index}]"
            require_object(step, where)
            source = require_text(step.get("source"), f"{where}.source")
            if source not in SOURCES:
                raise RecordError(f"{where}.source: expected one of {', '.join(sorted(SOURCES))}, got {source!r}")
            message = require_text(step.get("message", ""), f"{where}.message")
            if source == "system":
                system_prompts.append(message)
            elif source == "user":
                if task is None:
                    task = message
                else:
                    skipped_user += 1
            else:
                step_turns, missing = _agent_turns(step, where)
                if step_turns and gap is not None:
                    raise RecordError(f"{gap}: a tool call without an observation result, before later actions")
                if missing:
                    gap = gap or missing[0]
                unanswered += len(missing)
                turns.extend(_without_reply_warnings(turn) for turn in step_turns)
        if not turns:
            raise RecordError(f"no environment actions: {len(steps)} steps, none an agent action with an observation")
        agent = record.get("agent")
        if not isinstance(agent, dict):
            agent = {}
        metadata: dict[str, Any] = {
            "session_id": record.get("session_id"),
            "schema_version": record.get("schema_version"),
            "agent": {k: agent[k] for k in ("name", "version", "model_name") if k in agent},
            "user_messages_skipped": skipped_user,
            "unanswered_actions": unanswered,
        }
        if system_prompts:
            metadata["agent_system_prompt"] = "\n\n".join(system_prompts)
        return Trajectory(
            source="",
            domain=domain or domain_of_tools((t.tool_name for t in turns), self.default_domain),
            turns=turns,
            system=SystemPrompt(),
            task=task,
            metadata=metadata,
            format=self.name,
        )


def _agent_turns(step: dict[str, Any], where: str) -> tuple[list[Turn], list[str]]:
    """The turns of one agent step, and where its calls without a result are (in order)."""
    calls = step.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RecordError(f"{where}.tool_calls: expected a list, got {type(calls).__name__}")
    observation = step.get("observation") or {}
    if not isinstance(observation, dict) or not isinstance(observation.get("results", []), list):
        raise RecordError(f"{where}.observation.results: expected a list")
    results = observation.get("results", [])
    for number, result in enumerate(results):
        if not isinstance(result, dict):
            raise RecordError(f"{where}.observation.results[{number}]: expected an object")
    message = step.get("message") or ""
    reasoning = step.get("reasoning_content")
    thought = "\n\n".join(t for t in (reasoning, message) if isinstance(t, str) and t)
    if not calls:
        if not results:
            return [], []
        text = "\n".join(_result_text(r, f"{where}.observation.results[{n}]") for n, r in enumerate(results))
        metadata: dict[str, Any] = {"thought": reasoning} if reasoning else {}
        if REJECTED_REPLY.match(text):
            return [
                Turn(action=message, observation=text, is_error=True, metadata={**metadata, "kind": "format_error"})
            ], []
        return [Turn(action=message, observation=text, metadata=metadata)], []

    rendered = [_call(call, f"{where}.tool_calls[{number}]") for number, call in enumerate(calls)]
    if len(calls) > 1 and len(results) == 1 and not isinstance(results[0].get("source_call_id"), str):
        names = {name for name, _, _ in rendered}
        return [
            Turn(
                action="\n".join(action for _, action, _ in rendered),
                observation=_result_text(results[0], f"{where}.observation.results[0]"),
                tool_name=names.pop() if len(names) == 1 else None,
                metadata={"thought": thought, "calls": len(calls)} if thought else {"calls": len(calls)},
            )
        ], []

    by_id = {r["source_call_id"]: n for n, r in enumerate(results) if isinstance(r.get("source_call_id"), str)}
    in_order = [n for n, r in enumerate(results) if not isinstance(r.get("source_call_id"), str)]
    turns: list[Turn] = []
    missing: list[str] = []
    for number, (name, action, call_id) in enumerate(rendered):
        answer = by_id.pop(call_id, None)
        if answer is None and in_order:
            answer = in_order.pop(0)
        if answer is None:
            missing.append(f"{where}.tool_calls[{number}]")
            continue
        if missing:
            raise RecordError(f"{missing[0]}: a tool call without an observation result, before later actions")
        turns.append(
            Turn(
                action=action,
                observation=_result_text(results[answer], f"{where}.observation.results[{answer}]"),
                tool_name=name,
                metadata={"thought": thought} if thought and not turns else {},
            )
        )
    return turns, missing


def _call(call: Any, where: str) -> tuple[str, str, str]:
    """A tool call's name, its rendered action, and its id."""
    require_object(call, where)
    name = require_text(call.get("function_name"), f"{where}.function_name")
    arguments = parse_arguments(call.get("arguments"), f"{where}.arguments")
    call_id = require_text(call.get("tool_call_id"), f"{where}.tool_call_id")
    return name, render_call(name, arguments), call_id


def _without_reply_warnings(turn: Turn) -> Turn:
    found = REPLY_WARNINGS.match(turn.observation)
    if found is not None:
        turn.metadata["reply_warnings"] = found.group(1)
        turn.observation = turn.observation[found.end() :]
    return turn


def _result_text(result: dict[str, Any], where: str) -> str:
    """A result's content; a delegated subagent's result without content is its reference."""
    content = result.get("content")
    if isinstance(content, (str, list)):
        return as_text(content)
    if content is not None:
        raise RecordError(f"{where}.content: expected a string, got {type(content).__name__}")
    if result.get("subagent_trajectory_ref") is not None:
        return as_text(result["subagent_trajectory_ref"])
    raise RecordError(f"{where}: a result with neither `content` nor `subagent_trajectory_ref`")
