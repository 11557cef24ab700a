"""The AgentWorldBench-style LLM judge (issue 18): per-domain prompts that classify content first, a
free reasoning, then the verdict as JSON inside `<final_evaluation>` tags.

The per-domain prompt is `data/prompts/eval_judge_tagged.md` with the domain's rubric
(`data/rubrics/<domain>.md`: the content classes of that domain and the scoring standard of each)
in place of `{rubric}`. The judge reasons first and answers last, as AgentWorldBench's judge does
(eval/lwm_eval_utils: the last `<final_evaluation>` block of the answer, its thinking removed, a
JSON object in a ```json fence with `scores` for the five dimensions); so no structured-output
schema is sent, which would forbid the reasoning before the verdict. An answer without a valid
block, a missing dimension or a score outside 1-5 is an invalid judgement, counted and left out of
the means (the table's `judge_invalid`), never a score. Sampling (temperature, max_tokens; eval.py
uses 0.6 and 32,768) is the judge endpoint's configuration.
"""

import json
import re
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.rewards.rubrics import files_digest, load_rubric, prompt_path, prompt_text, rubric_files
from pipeline.sft.judging import CRITERIA, PointwiseItem, Verdict

PROMPT = "eval_judge_tagged"
INVALID_SCORE = 0.0
THINKING = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
VERDICT = re.compile(r"<final_evaluation>(.*?)(?:</final_evaluation>|\Z)", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class Scores(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: int = Field(ge=1, le=5)
    factuality: int = Field(ge=1, le=5)
    consistency: int = Field(ge=1, le=5)
    realism: int = Field(ge=1, le=5)
    quality: int = Field(ge=1, le=5)


class TaggedAnswer(BaseModel):
    content_classes: list[str] = []
    strengths: list[str] = []
    weaknesses: list[str] = []
    scores: Scores


def prompts_digest() -> str:
    """What the judge is told: its prompt and every rubric (an edited rubric is another judge)."""
    return files_digest([prompt_path(PROMPT), *rubric_files()])


def verdict_rejection(text: str) -> str | None:
    """For the LLM client's `accept`: why an answer holds no verdict (retried, then a failed request), or None."""
    return parse_verdict(text).invalid_reason


def parse_verdict(text: str | None, error: str | None = None) -> Verdict:
    if text is None:
        return Verdict(INVALID_SCORE, False, invalid_reason=f"request failed: {error}")
    blocks = VERDICT.findall(THINKING.sub("", text))
    if not blocks:
        return Verdict(INVALID_SCORE, False, invalid_reason="no <final_evaluation> block", raw=text)
    body = blocks[-1]
    fenced = FENCE.search(body)
    try:
        answer = TaggedAnswer.model_validate(json.loads(fenced.group(1) if fenced else body))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        kind = "out of range" if first["type"] in ("greater_than_equal", "less_than_equal") else first["type"]
        return Verdict(INVALID_SCORE, False, invalid_reason=f"{kind}: {field}", raw=text)
    except ValueError:
        return Verdict(INVALID_SCORE, False, invalid_reason="not JSON", raw=text)
    criteria = {name: float(getattr(answer.scores, name)) for name in CRITERIA}
    return Verdict(sum(criteria.values()) / len(criteria), True, criteria, raw=text)


def _context(item: PointwiseItem, history_turns: int) -> str:
    turns = list(item.query.history)[-history_turns:] if history_turns else []
    earlier = "\n\n".join(f"{turn.action}\n{turn.observation}" for turn in turns)
    return f"# Context (earlier turns)\n\n{earlier}\n\n" if earlier else ""


class TaggedJudge:
    """Scores predictions through the LLM client (each answer cached in the store as it arrives)."""

    def __init__(self, client, history_turns: int):
        self.client = client
        self.history_turns = history_turns
        self.template = prompt_text(PROMPT)

    def system(self, domain: str) -> str:
        return self.template.replace("{rubric}", load_rubric(domain))

    def pointwise(self, items: Sequence[PointwiseItem]) -> list[Verdict]:
        from pipeline.llm.client import ChatRequest

        requests = [
            ChatRequest(
                (
                    {"role": "system", "content": self.system(item.query.domain)},
                    {
                        "role": "user",
                        "content": f"{_context(item, self.history_turns)}# Current turn\n\n{item.query.action}\n\n"
                        f"**World model output (simulated):**\n```\n{item.prediction}\n```\n\n"
                        f"**Ground truth (real output):**\n```\n{item.query.reference}\n```",
                    },
                )
            )
            for item in items
        ]
        answers = self.client.complete_sync(requests, accept=verdict_rejection) if requests else []
        return [parse_verdict(answer.text, answer.error) for answer in answers]
