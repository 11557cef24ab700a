"""A candidate's text, parsed strictly into its thinking and its predicted observation.

The thinking format is Qwen3's: `<think>\n{thinking}\n</think>\n\n{observation}`. A candidate that
does not have exactly that shape is stored with the reason it failed and never repaired: guessing
where a thinking block was meant to end would put reasoning into the observation (or the reverse),
and the judge would then score a text the generator never wrote as an observation.

Rules, in order (the first that fails is the status):
- `generation_failed`: the request failed after its retries (no text);
- `held_secret`: the answer held an API key (an endpoint echoing the Authorization header), which
  the client redacted (pipeline/llm/credentials.py): never judged, never trained on;
- `missing_think`: the text does not begin with `<think>` (leading whitespace allowed);
- `unclosed_think`: no `</think>`;
- `extra_think_tag`: more than one `<think>` or `</think>` (a nested or repeated block);
- `empty_thinking`: nothing but whitespace between the tags.
The prediction is everything after `</think>` less the blank line that separates it (up to two
newlines): leading spaces and trailing text are kept, since a terminal's output starts and ends
where it does. It may be empty: `mkdir x` prints nothing, and a simulator must be able to say so.
The thinking is stripped of surrounding whitespace.
"""

from dataclasses import dataclass

from pipeline.llm.credentials import REDACTED
from pipeline.llm.thinking_format import THINK_CLOSE, THINK_OPEN, render_thinking_output

PARSED = "ok"
__all__ = ["THINK_CLOSE", "THINK_OPEN", "ParsedCandidate", "parse_candidate", "parse_direct", "render_thinking_output"]
# The status of a direct answer that wrote a thinking tag anyway: not in its format.
THINK_TAG_IN_DIRECT = "think_tag_in_direct"


@dataclass(frozen=True, slots=True)
class ParsedCandidate:
    status: str
    thinking: str | None = None
    prediction: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == PARSED


def parse_candidate(text: str | None) -> ParsedCandidate:
    if text is None:
        return ParsedCandidate("generation_failed")
    if REDACTED in text:
        return ParsedCandidate("held_secret")
    body = text.lstrip()
    if not body.startswith(THINK_OPEN):
        return ParsedCandidate("missing_think")
    if THINK_CLOSE not in body:
        return ParsedCandidate("unclosed_think")
    if body.count(THINK_OPEN) != 1 or body.count(THINK_CLOSE) != 1:
        return ParsedCandidate("extra_think_tag")
    thinking, _, rest = body[len(THINK_OPEN) :].partition(THINK_CLOSE)
    if not thinking.strip():
        return ParsedCandidate("empty_thinking")
    for separator in ("\n\n", "\n"):
        if rest.startswith(separator):
            rest = rest[len(separator) :]
            break
    return ParsedCandidate(PARSED, thinking.strip(), rest)


def parse_direct(text: str | None) -> ParsedCandidate:
    """A direct answer (issue 28): the observation alone, as written, whitespace included (`mkdir x`
    prints nothing, so an empty answer can be right). Not in its format when it holds a thinking tag:
    a model asked for the observation that reasons aloud would hand its reasoning to the agent."""
    if text is None:
        return ParsedCandidate("generation_failed")
    if REDACTED in text:
        return ParsedCandidate("held_secret")
    if THINK_OPEN in text or THINK_CLOSE in text:
        return ParsedCandidate(THINK_TAG_IN_DIRECT)
    return ParsedCandidate(PARSED, None, text)
