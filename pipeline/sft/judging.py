"""Judges of SFT candidates: an LLM judge with the domain's rubric, or the offline similarity judge.

A judge does up to three things (issues 10 and 17):
- `pointwise`: score one parsed candidate against the reference. The LLM judge scores SPEC's five
  criteria 1-5 with the domain's rubric (which classifies the observation's content first) and
  answers a JSON schema, sent as the endpoint's structured output; the answer is validated, and an
  answer that is not JSON, misses a criterion or holds a score outside 1-5 is recorded as invalid
  with the reason and scores the candidate 0. The score is the mean of the five criteria.
- `agreement`: how far a candidate's prediction agrees with the reference on deterministic content,
  the selection's thinking check (pipeline/sft/selection.py). The LLM judge's measure is its
  factuality criterion (1-5); the similarity judge's the content agreement of the offline scorer
  (pipeline/rewards/semantic.py's `deterministic_agreement`, 0-1).
- `pairwise` (only where `compares_pairwise`): given the reference and two candidates A and B,
  which is better. Asked in both orders by the selection to cancel position bias.

The similarity judge (`semantic`) maps the offline judge's score (pipeline/rewards/semantic.py: the
content the action does not hold, the format, the embedding similarity) onto the same scale,
score = 1 + 4 x similarity, with no criteria: it measures closeness to the reference, not format,
factuality, consistency, realism and quality separately. It does not compare pairwise: comparing two
similarities restates its pointwise ranking, which is no second opinion (issue 17, item 8).

The judge sees only the extracted prediction (strict parsing, pipeline/sft/candidates.py), never
the thinking, so self-praise in the reasoning cannot reach it (SPEC.md, Stage 3).
"""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.rewards.rubrics import load_rubric, prompt_text
from pipeline.rewards.semantic import deterministic_agreement
from pipeline.sft.queries import Query

CRITERIA = ("format", "factuality", "consistency", "realism", "quality")
# Characters of each history turn, and of a long reference or prediction, shown to the LLM judge.
HISTORY_CHARS = 1500
TEXT_CHARS = 12_000
INVALID_SCORE = 0.0


class PointwiseAnswer(BaseModel):
    """The JSON the LLM judge must answer for one candidate (its schema is sent as structured output)."""

    model_config = ConfigDict(extra="forbid")
    content_classes: list[str]
    format: int = Field(ge=1, le=5)
    factuality: int = Field(ge=1, le=5)
    consistency: int = Field(ge=1, le=5)
    realism: int = Field(ge=1, le=5)
    quality: int = Field(ge=1, le=5)
    rationale: str


class PairwiseAnswer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    winner: Literal["A", "B", "tie"]
    rationale: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """A pointwise judgement: criteria (None for the similarity judge or an invalid answer) and the score."""

    score: float
    valid: bool
    criteria: dict[str, float] | None = None
    invalid_reason: str | None = None
    raw: str | None = None


@dataclass(frozen=True, slots=True)
class Preference:
    """A pairwise judgement in one order: `winner` is A, B or tie (None when the answer was invalid)."""

    winner: str | None
    valid: bool
    invalid_reason: str | None = None
    raw: str | None = None


def _cut(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters]"


def _context(query: Query, history_turns: int) -> str:
    lines = []
    for turn in list(query.history)[-history_turns:] if history_turns else []:
        lines += [
            f"Action: {_cut(turn.action, HISTORY_CHARS)}",
            f"Observation: {_cut(turn.observation, HISTORY_CHARS)}",
        ]
    history = "\n".join(lines) if lines else "(none shown)"
    return f"## Domain\n{query.domain}\n\n## Recent history\n{history}\n\n## Action\n{_cut(query.action)}"


def _json_schema_format(name: str, model: type[BaseModel]) -> dict:
    schema = model.model_json_schema()
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


FENCED = re.compile(r"\A```(?:json)?\s*\n(.*)\n```\Z", re.DOTALL)


def _load_json(text: str) -> object:
    """JSON, or JSON as the one thing inside a code fence (endpoints without structured output fence it)."""
    stripped = text.strip()
    fenced = FENCED.match(stripped)
    return json.loads(fenced.group(1) if fenced else stripped)


def validate_pointwise(text: str | None, error: str | None = None) -> Verdict:
    if text is None:
        return Verdict(INVALID_SCORE, False, invalid_reason=f"request failed: {error}", raw=None)
    try:
        answer = PointwiseAnswer.model_validate(_load_json(text))
    except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError are ValueErrors
        return Verdict(INVALID_SCORE, False, invalid_reason=_reason(exc), raw=text)
    criteria = {name: float(getattr(answer, name)) for name in CRITERIA}
    return Verdict(sum(criteria.values()) / len(criteria), True, criteria, raw=text)


def validate_pairwise(text: str | None, error: str | None = None) -> Preference:
    if text is None:
        return Preference(None, False, f"request failed: {error}")
    try:
        answer = PairwiseAnswer.model_validate(_load_json(text))
    except ValueError as exc:
        return Preference(None, False, _reason(exc), text)
    return Preference(answer.winner, True, raw=text)


def pointwise_rejection(text: str) -> str | None:
    """For the LLM client's `accept`: why a pointwise answer is no judgement, or None. A judge's garbage is then
    retried as a failed request is, counted against `max_failed_fraction`, never stored as done (found by probing:
    a judge answering prose with HTTP 200 left every query "no_valid_judgement", and the rerun asked nothing)."""
    return validate_pointwise(text).invalid_reason


def pairwise_rejection(text: str) -> str | None:
    """`pointwise_rejection` for a pairwise answer."""
    return validate_pairwise(text).invalid_reason


def _reason(exc: ValueError) -> str:
    """A short, stable reason: `not JSON`, or the first schema violation with its field."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(answer)"
        kind = "out of range" if first["type"] in ("greater_than_equal", "less_than_equal") else first["type"]
        return f"{kind}: {field}"
    return "not JSON"


@dataclass(frozen=True, slots=True)
class PointwiseItem:
    query: Query
    prediction: str


@dataclass(frozen=True, slots=True)
class PairwiseItem:
    query: Query
    first: str  # shown as A
    second: str  # shown as B


class LLMJudge:
    """The rubric judge behind an OpenAI-compatible endpoint (or a local model), through the LLM client."""

    compares_pairwise = True

    def __init__(self, client, history_turns: int):
        self.client = client
        self.history_turns = history_turns
        self.pointwise_prompt = prompt_text("sft_judge_pointwise")
        self.pairwise_prompt = prompt_text("sft_judge_pairwise")

    def _system(self, template: str, domain: str) -> str:
        return template.replace("{rubric}", load_rubric(domain))

    def pointwise(self, items: Sequence[PointwiseItem]) -> list[Verdict]:
        from pipeline.llm.client import ChatRequest

        response_format = _json_schema_format("pointwise_judgement", PointwiseAnswer)
        requests = [
            ChatRequest(
                (
                    {"role": "system", "content": self._system(self.pointwise_prompt, item.query.domain)},
                    {
                        "role": "user",
                        "content": f"{_context(item.query, self.history_turns)}\n\n## Reference observation\n"
                        f"{_cut(item.query.reference)}\n\n## Predicted observation\n{_cut(item.prediction)}",
                    },
                ),
                response_format=response_format,
            )
            for item in items
        ]
        answers = self.client.complete_sync(requests, accept=pointwise_rejection) if requests else []
        return [validate_pointwise(answer.text, answer.error) for answer in answers]

    def agreement(self, item: PointwiseItem, criteria: Mapping[str, float | None]) -> float | None:
        """The factuality criterion of the candidate's valid pointwise judgement: the rubric's standard for
        deterministic content (it must match), where the other criteria also admit a plausible guess."""
        return criteria.get("factuality")

    def pairwise(self, items: Sequence[PairwiseItem]) -> list[Preference]:
        from pipeline.llm.client import ChatRequest

        response_format = _json_schema_format("pairwise_judgement", PairwiseAnswer)
        requests = [
            ChatRequest(
                (
                    {"role": "system", "content": self._system(self.pairwise_prompt, item.query.domain)},
                    {
                        "role": "user",
                        "content": f"{_context(item.query, self.history_turns)}\n\n## Reference observation\n"
                        f"{_cut(item.query.reference)}\n\n## Prediction A\n{_cut(item.first)}\n\n## Prediction B\n{_cut(item.second)}",
                    },
                ),
                response_format=response_format,
            )
            for item in items
        ]
        answers = self.client.complete_sync(requests, accept=pairwise_rejection) if requests else []
        return [validate_pairwise(answer.text, answer.error) for answer in answers]


class SemanticJudge:
    """The offline similarity judge: 1 + 4 x similarity, no criteria, no pairwise step (see the module docstring)."""

    compares_pairwise = False

    def __init__(self):
        from pipeline.rewards.semantic import SemanticScorer

        self.scorer = SemanticScorer()

    def pointwise(self, items: Sequence[PointwiseItem]) -> list[Verdict]:
        similarities = self.scorer.similarities(
            [(item.prediction, item.query.reference, item.query.action) for item in items]
        )
        return [
            Verdict(1.0 + 4.0 * s.value, True, raw=json.dumps({"similarity": round(s.value, 6), "method": s.method}))
            for s in similarities
        ]

    def agreement(self, item: PointwiseItem, criteria: Mapping[str, float | None]) -> float:
        return deterministic_agreement(item.prediction, item.query.reference, item.query.action)
