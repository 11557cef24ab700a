"""ShareGPT conversations: `{"conversations": [{"from": ..., "value": ...}]}` (AgentInstruct,
AgentTuning, AgentGym, LLaMA-Factory), one per JSONL line or a JSON list of them (one record each).

Speakers: `human`/`user` and `observation`/`tool` speak for the environment, `gpt`/`assistant` and
`function_call` for the agent, `system` is the agent's prompt (metadata["agent_system_prompt"]).
An agent message is the action: after its last `Action:` (or `Act:`) marker when it has one, the
text before the marker kept as the turn's thought; a `function_call` value (`{"name",
"arguments"}`) is rendered as a tool call. The next environment message is the observation, a
leading `Observation:` stripped.

The first human message is the task. AgentInstruct and AgentGym open with the agent's
instructions, a one-line acknowledgement ("OK"), then the real task: when the first agent message
is such an acknowledgement, the first human message is the agent's prompt and the one after it the
task. A message with an action marker is never an acknowledgement, however it starts. An agent message left unanswered at the end is skipped and counted; two agent messages in a
row, or two environment messages, are a broken exchange and quarantine the record.

Domain: from the record's id prefix where the dataset names its environment (`os_`, `webshop_`,
`alfworld_`, ...), else text-game when the task reads as one, else other.
"""

import re
from collections.abc import Iterator
from typing import Any

from pipeline.formats.base import Document, FormatAdapter
from pipeline.formats.domains import is_text_game, task_line
from pipeline.formats.tool_calls import parse_arguments, render_call
from pipeline.store.schema import RecordError, SystemPrompt, Trajectory, Turn, require_object, require_text

AGENT = {"gpt", "assistant", "function_call"}
ENVIRONMENT = {"human", "user", "observation", "tool"}
ACTION_MARKER = re.compile(r"\b(?:ACTION|Action|Act)\s*:")
OBSERVATION_PREFIX = re.compile(r"^\s*observation\s*:\s*", re.IGNORECASE)
ACKNOWLEDGEMENT = re.compile(r"^\s*(ok|okay|sure|got it|understood)\b[^\n]{0,80}$", re.IGNORECASE)
# Environment names as AgentInstruct / AgentGym prefix their ids (`os_12`, `webshop_3`).
DOMAIN_BY_ID_PREFIX = {
    "os": "terminal",
    "alfworld": "text-game",
    "sciworld": "text-game",
    "textcraft": "text-game",
    "babyai": "text-game",
    "maze": "text-game",
    "wordle": "text-game",
    "webshop": "web",
    "mind2web": "web",
    "webarena": "web",
    "weather": "mcp",
    "movie": "mcp",
    "todo": "mcp",
    "academia": "mcp",
    "sheet": "mcp",
    "kg": "mcp",
}


def _is_conversation(value: Any) -> bool:
    messages = value.get("conversations") if isinstance(value, dict) else None
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(isinstance(m, dict) and "from" in m and "value" in m for m in messages)
    )


class Adapter(FormatAdapter):
    name = "sharegpt"
    default_domain = "other"
    description = "ShareGPT `conversations` (from/value): AgentInstruct, AgentGym, AgentTuning."

    def detect(self, content: Any) -> bool:
        if isinstance(content, list) and content:
            return _is_conversation(content[0])
        return _is_conversation(content)

    def records(self, document: Document) -> Iterator[Document]:
        if isinstance(document.content, list):
            for index, record in enumerate(document.content):
                yield Document(f"{document.location}[{index}]", record)
        else:
            yield document

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if not isinstance(record, dict):
            raise RecordError(f"expected a JSON object, got {type(record).__name__}")
        messages = record.get("conversations")
        if not isinstance(messages, list):
            raise RecordError("conversations: expected a list")
        speakers = []
        for index, message in enumerate(messages):
            where = f"conversations[{index}]"
            require_object(message, where)
            speaker = require_text(message.get("from"), f"{where}.from")
            if speaker not in AGENT | ENVIRONMENT | {"system"}:
                raise RecordError(f"{where}.from: unknown speaker {speaker!r}")
            speakers.append((speaker, require_text(message.get("value"), f"{where}.value")))

        prompts = [value for speaker, value in speakers if speaker == "system"]
        exchange = [(index, s, v) for index, (s, v) in enumerate(speakers) if s != "system"]
        if not exchange or exchange[0][1] not in ENVIRONMENT:
            raise RecordError("conversations: expected the first non-system message to be the human's task")
        skipped = 0
        if len(exchange) > 2 and exchange[1][1] in AGENT and _is_acknowledgement(exchange[1][2]):
            prompts.append(exchange[0][2])
            exchange = exchange[2:]
            skipped = 1
        task = exchange[0][2]

        turns: list[Turn] = []
        pending: Turn | None = None
        for index, speaker, value in exchange[1:]:
            where = f"conversations[{index}]"
            if speaker in AGENT:
                if pending is not None:
                    raise RecordError(f"{where}: two agent messages in a row, the first without an observation")
                pending = _action(speaker, value, where)
            elif pending is None:
                raise RecordError(f"{where}: an environment message that answers no action")
            else:
                pending.observation = OBSERVATION_PREFIX.sub("", value, count=1)
                turns.append(pending)
                pending = None
        if not turns:
            raise RecordError(f"no environment actions: {len(messages)} messages, no agent message answered")

        metadata: dict[str, Any] = {k: record[k] for k in ("id", "item_id") if k in record}
        metadata.update({"assistant_messages_skipped": skipped, "unanswered_actions": int(pending is not None)})
        if prompts:
            metadata["agent_system_prompt"] = "\n\n".join(prompts)
        domain = domain or _domain(record, task)
        text_game = domain == "text-game"
        return Trajectory(
            source="",
            domain=domain,
            turns=turns,
            system=SystemPrompt(initial_state=task if text_game else None),
            task=(task_line(task) or task) if text_game else task,
            metadata=metadata,
            format=self.name,
        )


def _is_acknowledgement(value: str) -> bool:
    """ "OK", "Sure, I will follow the format." ...; never a message that holds an action ("Sure, I
    will count them. Act: bash ls /etc | wc -l" acts: its turn and the task stay where they are)."""
    return ACKNOWLEDGEMENT.match(value) is not None and ACTION_MARKER.search(value) is None


def _action(speaker: str, value: str, where: str) -> Turn:
    if speaker == "function_call":
        call = parse_arguments(value, f"{where}.value")
        name = require_text(call.get("name"), f"{where}.value.name")
        arguments = parse_arguments(call.get("arguments"), f"{where}.value.arguments")
        return Turn(action=render_call(name, arguments), observation="", tool_name=name)
    markers = list(ACTION_MARKER.finditer(value))
    if not markers:
        return Turn(action=value.strip(), observation="")
    thought = value[: markers[-1].start()].strip()
    return Turn(
        action=value[markers[-1].end() :].strip(),
        observation="",
        metadata={"thought": thought} if thought else {},
    )


def _domain(record: dict[str, Any], task: str) -> str:
    for key in ("id", "item_id"):
        if isinstance(record.get(key), str):
            prefix = record[key].split("_", 1)[0].lower()
            if prefix in DOMAIN_BY_ID_PREFIX:
                return DOMAIN_BY_ID_PREFIX[prefix]
    return "text-game" if is_text_game(task) else Adapter.default_domain
