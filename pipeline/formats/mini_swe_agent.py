"""mini-swe-agent runs: a list of `{role, content}` messages, or its `.traj.json`
`{"info": {...}, "messages": [...], "trajectory_format": "mini-swe-agent-1"}`.

The agent answers every user message with one fenced bash block (```bash or
```mswea_bash_command): that block is the action, the next user message its observation, kept as
the environment printed it (`<returncode>N</returncode><output>...</output>`). N goes to turn
metadata and N != 0 sets is_error. An assistant message without exactly one block is a format
error: the harness's complaint is its observation, is_error is set and metadata kind is
`format_error`, which the retry-cycle filter drops when the agent retried.

The system message is the agent's prompt (metadata["agent_system_prompt"]); the first user message
is the task. An `exit` message and info's exit status and submission go to metadata. Domain swe,
tool_name `bash`.
"""

import re
from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.store.schema import RecordError, SystemPrompt, Trajectory, Turn, as_text, require_text

# mini-swe-agent's own action regex (v1 used ```bash, later versions ```mswea_bash_command).
BASH_BLOCK = re.compile(r"```(?:bash|mswea_bash_command)\s*\n(.*?)\n```", re.DOTALL)
RETURN_CODE = re.compile(r"<returncode>(-?\d+)</returncode>")


def _messages(content: Any) -> Any:
    return content.get("messages") if isinstance(content, dict) else content


class Adapter(FormatAdapter):
    name = "mini-swe-agent"
    default_domain = "swe"
    description = "mini-swe-agent message lists (fenced bash actions, `<returncode>` observations)."

    def detect(self, content: Any) -> bool:
        if isinstance(content, dict) and str(content.get("trajectory_format", "")).startswith("mini-swe-agent"):
            return True
        messages = _messages(content)
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return False
        texts = [(m.get("role"), m.get("content")) for m in messages]
        return any(r == "assistant" and isinstance(c, str) and BASH_BLOCK.search(c) for r, c in texts) and any(
            r == "user" and isinstance(c, str) and RETURN_CODE.search(c) for r, c in texts
        )

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        messages = _messages(record)
        where = "messages"
        if not isinstance(messages, list):
            raise RecordError(f"{where}: expected a list of messages, got {type(messages).__name__}")
        metadata: dict[str, Any] = {}
        info = record.get("info") if isinstance(record, dict) else None
        if isinstance(info, dict):
            metadata.update({key: info[key] for key in ("exit_status", "submission") if key in info})

        turns: list[Turn] = []
        pending: Turn | None = None
        task: str | None = None
        for index, message in enumerate(messages):
            at = f"{where}[{index}]"
            if not isinstance(message, dict):
                raise RecordError(f"{at}: expected a message object, got {type(message).__name__}")
            role = require_text(message.get("role"), f"{at}.role")
            text = as_text(message.get("content"))
            if role == "system":
                metadata["agent_system_prompt"] = text
            elif role == "assistant":
                if pending is not None:
                    raise RecordError(f"{at}: a second assistant message before any observation")
                pending = _action(text)
            elif role == "user":
                if pending is None:
                    if task is not None:
                        raise RecordError(f"{at}: a user message that answers no action")
                    task = text
                    continue
                pending.observation = text
                if (code := RETURN_CODE.search(text)) is not None:
                    pending.metadata["returncode"] = int(code.group(1))
                    pending.is_error = int(code.group(1)) != 0
                turns.append(pending)
                pending = None
            elif role == "exit":
                metadata["exit_status"] = text
                extra = message.get("extra")
                if isinstance(extra, dict) and "submission" in extra:
                    metadata["submission"] = extra["submission"]
            else:
                raise RecordError(f"{at}.role: unknown role {role!r}")
        if not turns:
            raise RecordError(
                f"no environment actions: {len(messages)} messages, no action answered by the environment"
            )
        metadata["unanswered_actions"] = int(pending is not None)
        return Trajectory(
            source="",
            domain=domain or self.default_domain,
            turns=turns,
            system=SystemPrompt(),
            task=task,
            metadata=metadata,
            format=self.name,
        )


def _action(text: str) -> Turn:
    blocks = BASH_BLOCK.findall(text)
    if len(blocks) != 1:
        # What the agent emitted is the action the harness answered with its complaint.
        return Turn(
            action=text, observation="", is_error=True, metadata={"kind": "format_error", "blocks": len(blocks)}
        )
    thought = BASH_BLOCK.sub("", text).strip()
    return Turn(
        action=blocks[0].strip(), observation="", tool_name="bash", metadata={"thought": thought} if thought else {}
    )
