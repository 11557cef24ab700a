"""AgentWorldBench rows (QwenLM/Qwen-AgentWorld, `{domain}_test.jsonl`): one row is one scored turn.

A row: `task` (the domain, e.g. `mcp` or `agentworldbench/mcp`), `id`, `prompt` and `response` (every
action prompt and real observation of the trajectory, in order), `current_prompt` (the scored turn's
action as the judge sees it), `system_str` (the world model's system prompt for this row), `turn_idx`
(the scored turn, 1-indexed) and `total_turns`. The benchmark's model gets `system_str` as the system
message, turns 1..turn_idx-1 as user/assistant pairs and turn `turn_idx`'s prompt; its answer is scored
against `response[turn_idx - 1]` (eval/eval.py, `run_inference`).

The trajectory is turns 1..turn_idx (later turns are not the row's: each row of a trajectory is its own
record, and stops where its question does), the last one marked `benchmark_target: true`, so the
evaluation scores exactly that turn and never chooses another. `system_str` is kept verbatim in
metadata (`system_prompt`): the benchmark defines the prompt, so evaluation sends it as given; it is
also the task description, for a reader that knows only the five parts. Observations are kept as given,
the benchmark's `**Environment Observation:**` marker included (the history shows it to the model; the
evaluation strips it from the prediction and the reference before scoring, as eval.py's judge does).
"""

from typing import Any

from pipeline.formats.base import FormatAdapter
from pipeline.store.schema import DOMAINS, RecordError, SystemPrompt, Trajectory, Turn, require_text

FIELDS = ("task", "prompt", "response", "system_str", "turn_idx")
TARGET = "benchmark_target"
# eval/lwm_eval_utils/task_configs.py: every domain's `response_marker`.
RESPONSE_MARKER = "**Environment Observation:**"


def _texts(value: Any, what: str) -> list[str]:
    if isinstance(value, str):  # eval.py accepts a single string for a one-turn row
        return [value]
    if not isinstance(value, list):
        raise RecordError(f"{what}: expected a list of strings, got {type(value).__name__}")
    return [require_text(item, f"{what}[{i}]") for i, item in enumerate(value)]


class Adapter(FormatAdapter):
    name = "agentworldbench"
    default_domain = "other"
    description = "AgentWorldBench rows (`{domain}_test.jsonl`): one scored turn per row, its own system prompt."

    def detect(self, content: Any) -> bool:
        return isinstance(content, dict) and all(field in content for field in FIELDS)

    def parse(self, record: Any, domain: str | None) -> Trajectory:
        if not isinstance(record, dict):
            raise RecordError(f"expected an object, got {type(record).__name__}")
        prompts, responses = _texts(record.get("prompt"), "prompt"), _texts(record.get("response"), "response")
        turn_idx = record.get("turn_idx")
        if (
            not isinstance(turn_idx, int)
            or isinstance(turn_idx, bool)
            or not 1 <= turn_idx <= min(len(prompts), len(responses))
        ):
            raise RecordError(
                f"turn_idx: expected an integer from 1 to {min(len(prompts), len(responses))}, got {turn_idx!r}"
            )
        task = require_text(record.get("task"), "task")
        subtask = task.split("/")[-1]  # eval.py's get_subtask
        system = require_text(record.get("system_str"), "system_str")
        turns = [Turn(prompts[i], responses[i]) for i in range(turn_idx)]
        turns[-1].metadata[TARGET] = True
        metadata = {
            "benchmark": "agentworldbench",
            "id": record.get("id"),
            "task": task,
            "turn_idx": turn_idx,
            "total_turns": record.get("total_turns"),
            "system_prompt": system,
            "response_marker": RESPONSE_MARKER,
        }
        if isinstance(record.get("current_prompt"), str):
            metadata["current_prompt"] = record["current_prompt"]
        return Trajectory(
            source="",
            domain=domain or (subtask if subtask in DOMAINS else self.default_domain),
            turns=turns,
            system=SystemPrompt(task_description=system),
            task=f"{task}:{record.get('id')}",
            metadata=metadata,
            format=self.name,
        )
