"""Observation first, thinking second: the rationale mode of an SFT generator (`rationale: true`).

A small local generator (the 135M CPT checkpoint of the demo) loses the observation when it thinks first:
after its own thinking block it writes the system prompt back, or a listing of the wrong folder, and
with budget forcing it kept 1 of 10 demo queries. Its direct prediction, in the format CPT trained, is
its best work. So this mode asks two things of the same model:
1. the observation, prompted as CPT prompts (pipeline/prompts/cpt.py: the environment's system prompt,
   the history as turns, the action), sampled `samples` times per query;
2. for each, a thinking block: a one-turn request (data/prompts/sft_rationale.md) holding the action
   and that observation, asking what the action does and why the environment answers so, at most
   `thinking_budget` tokens.
The candidate is `<think>\n{rationale}\n</think>\n\n{observation}`, parsed and judged like any other:
the judge scores the observation against the real one, so selection is on what the model predicted,
and the thinking is written to explain the model's own prediction, never the reference (STaR's
rationalization shows the answer; this shows the model's guess, so nothing of the real observation
leaks into what is taught). Production generators (reasoning models behind an endpoint) think first.
"""

import re

from pipeline.prompts.cpt import DOMAIN_NAMES, render_cpt_system_prompt
from pipeline.rewards.rubrics import PROMPTS_DIR, files_digest, prompt_text
from pipeline.sft.queries import Query, chat_messages

RATIONALE_PROMPT = "sft_rationale"
# The observation as the rationale request shows it: a long listing's head says what it is.
SHOWN_OBSERVATION_CHARS = 1_500
EMPTY_OBSERVATION = "(nothing: the command printed no output)"
# A sentence's end: its stop, any closing quotes or brackets, then a space or the end of the text.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*(?=\s|$)")


def observation_messages(query: Query) -> tuple[dict[str, str], ...]:
    """The first request: the query as CPT trained the model to answer it, observation only."""
    return chat_messages(query, render_cpt_system_prompt(query.domain, query.system))


def rationale_messages(query: Query, observation: str) -> tuple[dict[str, str], ...]:
    """The second request: one user turn with the action and the model's own observation."""
    shown = observation.strip()
    if len(shown) > SHOWN_OBSERVATION_CHARS:
        shown = shown[:SHOWN_OBSERVATION_CHARS] + "\n[...]"
    text = prompt_text(RATIONALE_PROMPT).format(
        domain=query.domain,
        description=DOMAIN_NAMES.get(query.domain, DOMAIN_NAMES["other"]),
        action=query.action,
        observation=shown or EMPTY_OBSERVATION,
    )
    return ({"role": "user", "content": text},)


def rationale_text(answer: str) -> str:
    """The thinking a rationale answer gives: stripped, and cut after its last whole sentence when the
    budget ended it mid-sentence (a half sentence teaches the model to stop thinking mid-thought)."""
    text = answer.strip()
    ends = list(_SENTENCE_END.finditer(text))
    if not ends or ends[-1].end() == len(text):
        return text  # whole, or a single unfinished sentence: all there is
    return text[: ends[-1].end()]


def rationale_prompt_digest() -> str:
    return files_digest([PROMPTS_DIR / f"{RATIONALE_PROMPT}.md"])
