"""Streaming a thinking model's answer as deltas that never need taking back (issue 19: `stream=True`).

`split_thinking` (pipeline/serving/thinking.py) decides, on a whole answer, what is thinking
(`reasoning_content`) and what is the observation (`content`). While the answer grows, `AnswerStream`
shows of each only what no later token can change: nothing while the answer might still open with
`<think>`, thinking up to a possible partial `</think>` and without the whitespace `strip` would
remove, the observation once its separator (up to two newlines) is decided. Concatenated, the deltas
are exactly what the same answer gets without streaming. A direct answer (the request's answer
format, issue 28) is all observation and streams as it comes.
"""

from dataclasses import dataclass

from pipeline.llm.thinking_format import THINK_CLOSE, THINK_OPEN
from pipeline.serving.thinking import split_thinking


@dataclass
class AnswerStream:
    thinking_format: bool  # the request's answer format: False, direct, nothing is held back or split off
    include_thinking: bool
    sent_reasoning: str = ""
    sent_content: str = ""

    def deltas(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning delta, content delta) for the answer's text so far."""
        reasoning, content = self._visible(text, final)
        delta = reasoning[len(self.sent_reasoning) :], content[len(self.sent_content) :]
        self.sent_reasoning, self.sent_content = reasoning, content
        return delta

    def _visible(self, text: str, final: bool) -> tuple[str, str]:
        """(reasoning, content) that can be shown: each a prefix of what the whole answer gets."""
        if not self.thinking_format:
            return "", text
        if final:
            thinking, observation = split_thinking(text)
            return thinking or "", text if self.include_thinking else observation
        body = text.lstrip()
        if THINK_OPEN.startswith(body):  # may still open a thinking block: nothing is decided
            return "", text if self.include_thinking else ""
        if not body.startswith(THINK_OPEN):
            return "", text
        inside, closed, after = body[len(THINK_OPEN) :].partition(THINK_CLOSE)
        if not closed:
            inside = inside[: max(0, len(inside) - (len(THINK_CLOSE) - 1))]  # may end with a partial </think>
            return inside.strip(), text if self.include_thinking else ""
        if self.include_thinking:
            return inside.strip(), text
        if after in ("", "\n"):  # the separator (up to two newlines) is not decided yet
            return inside.strip(), ""
        observation = after[2:] if after.startswith("\n\n") else after[1:] if after.startswith("\n") else after
        return inside.strip(), observation
