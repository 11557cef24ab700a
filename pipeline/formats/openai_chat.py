"""OpenAI chat message lists: tau-bench runs, AgentBench's keyed demonstrations, bare message lists.

A record is a list of messages, `{"messages": [...], "tools": [...]}`, or a tau-bench run
`{task_id, reward, info, traj, trial}`. A file may hold many: a JSON list of runs or of
`{"messages"}` objects (one record each), or an object mapping task types to message lists
(AgentBench; one record per key).

Two readings, chosen per record:
- Tool-call chat (any message has `tool_calls` or the legacy `function_call`, or the record is a
  tau-bench run): each call is a turn, its action the rendered call (tool_calls.py), its
  observation the `role: "tool"` message with the call's id. Ids are matched among the calls
  still open, so an id reused once answered (AgentBench reuses one id for every call, tau-bench
  replays some) pairs in order; a message without an id answers the oldest open call. Assistant
  text to the human is not an environment turn: it is skipped and counted in metadata, as are
  later user messages.
- Plain chat (no tool calls anywhere): the assistant message is the action, the user message
  after it the observation.
A tool reply's `verifier` key (Python defining `verify(prediction) -> bool`, the rule reward's
code for that answer; issue 11) goes to its turn's metadata["verifier"].
The first user message is the task. The agent's system prompt is the agent's, not the
environment's: it goes to metadata["agent_system_prompt"], whole.

A call never answered is skipped and counted in metadata["unanswered_actions"] when no answered
action follows it (the run was cut off, or ended on a call the harness did not answer); one
followed by answered actions leaves a hole in their history and quarantines the record.

A call to a tool named `think` answered with nothing is a thought (metadata kind `thought`,
schema.THOUGHT): tau-bench's `think` tool "will not obtain new information or change the
database" and always answers "" (58 of the public airline file's 621 tool calls). It stays in the
history but is never a target.

Domain: a first user message that reads as a text game (ALFWorld's room and `Your task is to:`
line, as AgentBench's `take_action` runs) makes it `text-game`, that message the initial state
and its task line the task; otherwise the tools' signature (see domains.py), else `mcp` for a
tool-call chat and `other` for a plain one.
"""

import json
from collections.abc import Iterator
from typing import Any

from pipeline.formats.base import Document, FormatAdapter
from pipeline.formats.domains import domain_of_tools, is_text_game, task_line
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

ACTING_ROLES = {"assistant", "agent"}
ANSWER_ROLES = {"tool", "function"}
ROLES = ACTING_ROLES | ANSWER_ROLES | {"system", "user", "developer"}
# The think tool of tau-bench (and of Anthropic's "think" tool pattern): the agent thinking aloud.
THINK_TOOL = "think"
# Keys of a record that are the conversation itself; the others are the run's metadata.
CONVERSATION_KEYS = {"messages", "traj", "tools", "reward"}


def is_message_list(value: Any) -> bool:
    return (
        isinstance(value, list) and bool(value) and all(isinstance(m, dict) and m.get("role") in ROLES for m in value)
    )


def _conversation(record: dict[str, Any]) -> Any:
    return record["traj"] if "traj" in record else record.get("messages")


def _is_record_object(value: Any) -> bool:
    return (
        isinstance(value, dict) and ("traj" in value or "messages" in value) and is_message_list(_conversation(value))
    )


def _is_keyed(content: Any) -> bool:
    """AgentBench's `{task_type: [messages]}`; `{"messages": [...]}` is one record, not a key."""
    return (
        isinstance(content, dict)
        and bool(content)
        and not ({"messages", "traj"} & content.keys())
        and all(is_message_list(v) for v in content.values())
    )


class Adapter(FormatAdapter):
    name = "openai-chat"
    default_domain = "mcp"
    description = "OpenAI chat messages (tau-bench runs, AgentBench keyed lists, `{messages, tools}`)."

    def detect(self, content: Any) -> bool:
        if isinstance(content, list) and content and isinstance(content[0], dict) and "role" not in content[0]:
            return _is_record_object(content[0])
        return is_message_list(content) or _is_record_object(content) or _is_keyed(content)

    def records(self, document: Document) -> Iterator[Document]:
        content = document.content
        if isinstance(content, list) and content and isinstance(content[0], dict) and "role" not in content[0]:
            for index, record in enumerate(content):
                yield Document(f"{document.location}[{index}]", record)
        elif _is_keyed(content):
            for key, messages in content.items():
                yield Document(f"{document.location}[{key}]", messages)
        else:
            yield document

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if isinstance(record, list):
            messages, where, extra = record, "messages", {}
        elif isinstance(record, dict) and ("traj" in record or "messages" in record):
            where = "traj" if "traj" in record else "messages"
            messages = record[where]
            extra = record
        else:
            raise RecordError(
                f"expected a message list or an object with `messages` or `traj`, got {type(record).__name__}"
            )
        if not isinstance(messages, list):
            raise RecordError(f"{where}: expected a list of messages, got {type(messages).__name__}")
        tools = extra.get("tools") or []
        if isinstance(tools, str):
            # Hugging Face datasets often store the tool schemas as one JSON string column.
            tools = _parse_json(tools, "tools")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise RecordError("tools: expected a list of tool schemas (objects)")
        reward = extra.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
            raise RecordError(f"reward: expected a number, got {type(reward).__name__}")

        # tau-bench's runs are tool-call chats even when the agent never called a tool.
        tool_chat = "traj" in extra or any(isinstance(m, dict) and _calls(m) for m in messages)
        conversation = _Conversation(where, tool_chat)
        for index, message in enumerate(messages):
            conversation.read(index, message)
        turns = conversation.finish()
        if not turns:
            kind = "tool calls" if tool_chat else "assistant messages answered by a user message"
            raise RecordError(f"no environment actions: {len(messages)} messages, no {kind}")

        first_user = conversation.task
        if domain is None:
            if is_text_game(first_user):
                domain = "text-game"
            else:
                domain = domain_of_tools((t.tool_name for t in turns), "mcp" if tool_chat else "other")
        text_game = domain == "text-game" and first_user is not None
        metadata = {k: v for k, v in extra.items() if k not in CONVERSATION_KEYS}
        metadata.update(conversation.counts())
        if conversation.system_prompts:
            metadata["agent_system_prompt"] = "\n\n".join(conversation.system_prompts)
        return Trajectory(
            source="",
            domain=domain,
            turns=turns,
            system=SystemPrompt(tools=tools, initial_state=first_user if text_game else None),
            task=(task_line(first_user) or first_user) if text_game else first_user,  # type: ignore[arg-type]  # text_game: first_user is set
            outcome_reward=None if reward is None else float(reward),
            metadata=metadata,
            format=self.name,
        )


def _calls(message: dict[str, Any]) -> Any:
    """A message's tool calls; the legacy single `function_call` is one call without an id."""
    if message.get("tool_calls"):
        return message["tool_calls"]
    legacy = message.get("function_call")
    return [{"function": legacy}] if isinstance(legacy, dict) else []


def _parse_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{what}: a string that is not JSON ({exc})") from None


class _Conversation:
    """Reads messages in order and pairs each action with the message that answers it."""

    def __init__(self, where: str, tool_chat: bool):
        self.where = where
        self.tool_chat = tool_chat
        self.turns: list[Turn] = []
        # Actions waiting for their observation: (call id, turn index, field path of the call).
        self.open: list[tuple[str | None, int, str]] = []
        # Actions the conversation moved on from unanswered: (turn index, call path, where it moved on).
        self.abandoned: list[tuple[int, str, str]] = []
        self.task: str | None = None
        self.system_prompts: list[str] = []
        self.skipped_assistant = 0
        self.skipped_user = 0
        self.unanswered = 0

    def read(self, index: int, message: Any) -> None:
        where = f"{self.where}[{index}]"
        if not isinstance(message, dict):
            raise RecordError(f"{where}: expected a message object, got {type(message).__name__}")
        role = require_text(message.get("role"), f"{where}.role")
        if role not in ROLES:
            raise RecordError(f"{where}.role: unknown role {role!r}")
        content = message.get("content")
        if role in ("system", "developer"):
            self.system_prompts.append(as_text(content))
        elif role == "user":
            self._user(where, as_text(content))
        elif role in ACTING_ROLES:
            self._acting(where, message, content)
        else:
            self._answer(where, message, as_text(content))

    def _user(self, where: str, text: str) -> None:
        if self.task is None:
            self.task = text
        elif self.tool_chat:
            self._move_on(where)
            self.skipped_user += 1
        elif self.open:
            _, turn_index, _ = self.open.pop()
            self.turns[turn_index].observation = text
        else:
            raise RecordError(f"{where}: a user message that answers no assistant message")

    def _acting(self, where: str, message: dict[str, Any], content: Any) -> None:
        self._move_on(where)
        calls = _calls(message)
        if not isinstance(calls, list):
            raise RecordError(f"{where}.tool_calls: expected a list, got {type(calls).__name__}")
        thought = as_text(content)
        if not calls:
            if self.tool_chat:
                self.skipped_assistant += 1
            else:
                self.open.append((None, len(self.turns), where))
                self.turns.append(Turn(action=thought, observation=""))
            return
        for number, call in enumerate(calls):
            call_where = f"{where}.tool_calls[{number}]"
            require_object(call, call_where)
            function = call.get("function")
            if not isinstance(function, dict):
                raise RecordError(f"{call_where}.function: expected an object")
            name = require_text(function.get("name"), f"{call_where}.function.name")
            arguments = parse_arguments(function.get("arguments"), f"{call_where}.function.arguments")
            call_id = call.get("id")
            if call_id is not None and not isinstance(call_id, str):
                raise RecordError(f"{call_where}.id: expected a string, got {type(call_id).__name__}")
            metadata = {"thought": thought} if thought and number == 0 else {}
            self.open.append((call_id, len(self.turns), call_where))
            self.turns.append(
                Turn(action=render_call(name, arguments), observation="", tool_name=name, metadata=metadata)
            )

    def _answer(self, where: str, message: dict[str, Any], text: str) -> None:
        call_id = message.get("tool_call_id")
        position = next((k for k, (open_id, _, _) in enumerate(self.open) if open_id == call_id), None)
        if position is None and self.open and (call_id is None or self.open[0][0] is None):
            position = 0
        if position is None:
            raise RecordError(f"{where}.tool_call_id: {call_id!r} answers no open tool call")
        _, turn_index, _ = self.open.pop(position)
        turn = self.turns[turn_index]
        turn.observation = text
        if turn.tool_name == THINK_TOOL and not text.strip():
            turn.metadata["kind"] = THOUGHT
        verifier = message.get("verifier")
        if verifier is not None:  # the rule reward's code for this answer (issue 11): turn metadata
            turn.metadata["verifier"] = require_text(verifier, f"{where}.verifier")

    def _move_on(self, where: str) -> None:
        """A new user or assistant message: the calls still open will not be answered."""
        self.abandoned.extend((turn_index, call_where, where) for _, turn_index, call_where in self.open)
        self.open.clear()

    def finish(self) -> list[Turn]:
        unanswered = {turn_index for _, turn_index, _ in self.open} | {i for i, _, _ in self.abandoned}
        answered = [index for index in range(len(self.turns)) if index not in unanswered]
        for turn_index, call_where, where in self.abandoned:
            if answered and turn_index < answered[-1]:
                answer = "tool response" if self.tool_chat else "user message"
                raise RecordError(f"{call_where}: no {answer} before {where}")
        self.unanswered = len(unanswered)
        return [self.turns[index] for index in answered]

    def counts(self) -> dict[str, int]:
        return {
            "assistant_messages_skipped": self.skipped_assistant,
            "user_messages_skipped": self.skipped_user,
            "unanswered_actions": self.unanswered,
        }
