"""The rubric judge of the RL reward: the SFT judge's prompt, rubric, schema and validation, asked asynchronously.

Reused from pipeline/sft/judging.py: the system prompt (`data/prompts/sft_judge_pointwise.md` with
the domain's rubric), the context block (domain, recent history, action), the JSON schema sent as
structured output and `validate_pointwise` (not JSON, a missing criterion, a score outside 1-5: an
invalid verdict, score 0). Added for RL: a prompt that carried a control instruction shows it to the
judge, with `data/prompts/rl_judge_control.md` (how to score a fault against a reference that has
none). Requests go through `ChatClient.complete`, awaited, so TRL's async reward call runs the whole
batch concurrently.
"""

from collections.abc import Sequence

from pipeline.rewards.rubrics import load_rubric, prompt_text
from pipeline.rl.prompts import RLPrompt
from pipeline.sft.judging import (
    PointwiseAnswer,
    Verdict,
    _context,
    _cut,
    _json_schema_format,
    pointwise_rejection,
    validate_pointwise,
)
from pipeline.sft.queries import Query
from pipeline.store.schema import ScoredTurn, SystemPrompt


def judge_query(prompt: RLPrompt) -> Query:
    """The prompt as the SFT judge's context reads it: its history pairs and action, from its messages."""
    turns = prompt.messages[1:-1]
    history = tuple(
        ScoredTurn(-1, user["content"], assistant["content"], "history", 1.0)
        for user, assistant in zip(turns[::2], turns[1::2])
    )
    return Query(
        prompt.trajectory_id,
        prompt.turn_index,
        prompt.domain,
        SystemPrompt(),
        history,
        prompt.messages[-1]["content"],
        prompt.reference,
        0,
    )


class RubricJudge:
    def __init__(self, client, history_turns: int):
        self.client = client
        self.history_turns = history_turns
        self.prompt = prompt_text("sft_judge_pointwise")
        self.control_note = prompt_text("rl_judge_control")
        self.response_format = _json_schema_format("pointwise_judgement", PointwiseAnswer)

    def messages(self, prompt: RLPrompt, prediction: str) -> tuple[dict[str, str], ...]:
        system = self.prompt.replace("{rubric}", load_rubric(prompt.domain))
        control = ""
        if prompt.control_instruction:
            system = f"{system}\n\n{self.control_note}"
            control = f"\n\n## Control instruction given to the simulator\n{prompt.control_instruction}"
        user = (
            f"{_context(judge_query(prompt), self.history_turns)}{control}\n\n## Reference observation\n"
            f"{_cut(prompt.reference)}\n\n## Predicted observation\n{_cut(prediction)}"
        )
        return ({"role": "system", "content": system}, {"role": "user", "content": user})

    async def score(self, items: Sequence[tuple[RLPrompt, str]]) -> list[Verdict]:
        from pipeline.llm.client import ChatRequest

        if not items:
            return []
        requests = [
            ChatRequest(self.messages(prompt, prediction), response_format=self.response_format)
            for prompt, prediction in items
        ]
        answers = await self.client.complete(requests, accept=pointwise_rejection)
        return [validate_pointwise(answer.text, answer.error) for answer in answers]
