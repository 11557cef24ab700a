"""How each model is asked and teacher-forced: the prompt format of the stage that trained it (issue 17, item 14).

- `non-thinking`: base and CPT checkpoints, CPT's fixed template (pipeline/prompts/cpt.py). The answer
  is the observation itself; teacher forcing puts the real observation right after the assistant header.
- `thinking`: SFT checkpoints, SFT template 0 (pipeline/prompts/sft.py; one of the ten SFT trains on,
  and the one SFT's held-out score asks in), a `<think>` block, then the observation, extracted strictly
  (pipeline/sft/candidates.py) so that only the observation reaches the judge and the metrics.
- `rl-thinking`: RL checkpoints, RL's own fixed template without a control instruction
  (pipeline/prompts/rl.py), the format RL trains and the export serves; parsed as `thinking`.

Teacher forcing in a thinking format conditions the real observation on the model's own thinking when
its answer parsed: SFT samples always train a non-empty thinking block before the observation, so a
thinking model has never seen an observation after an empty block, and forcing one there would
measure a format it was not trained in. Where the answer did not parse there is no such context: that
row has no cross-entropy (the table counts the rows that have one, `ce_rows`).
A checkpoint given by path and not registered is asked as a base model unless `--thinking` says
otherwise (then as an SFT checkpoint).
"""

from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.rl import rl_system_prompt
from pipeline.prompts.sft import TEMPLATES
from pipeline.sft.candidates import THINK_CLOSE, THINK_OPEN, parse_candidate
from pipeline.sft.queries import Query, chat_messages

NON_THINKING = "non-thinking"
THINKING = "thinking"
RL_THINKING = "rl-thinking"
RETRIEVAL = "retrieval"
THINKING_FORMATS = (THINKING, RL_THINKING)
STAGE_FORMATS = {"base": NON_THINKING, "cpt": NON_THINKING, "sft": THINKING, "rl": RL_THINKING}


def system_prompt(query: Query, prompt_format: str) -> str:
    if prompt_format == THINKING:
        return TEMPLATES[0].render(query.domain, query.system)
    if prompt_format == RL_THINKING:
        return rl_system_prompt(query.domain, query.system, None)
    return render_cpt_system_prompt(query.domain, query.system)


def query_messages(query: Query, prompt_format: str, own_system: str | None = None) -> tuple[dict[str, str], ...]:
    """System prompt (a benchmark item's own when it carries one, verbatim: the benchmark defines it), the
    kept history as user (action) / assistant (observation) turns, the action."""
    return chat_messages(query, own_system if own_system is not None else system_prompt(query, prompt_format))


def extract_observation(text: str | None, prompt_format: str) -> tuple[str, str | None, str | None]:
    """(parse status, predicted observation, thinking) of a model's answer. Non-thinking answers are
    the observation as written (an empty one included: `mkdir x` prints nothing)."""
    if text is None:
        return "generation_failed", None, None
    if prompt_format not in THINKING_FORMATS:
        return "ok", text, None
    parsed = parse_candidate(text)
    return parsed.status, parsed.prediction, parsed.thinking


def answer_prefix(prompt_format: str, thinking: str | None) -> str | None:
    """What precedes the observation in the assistant turn under teacher forcing, in the format the model
    trained in: nothing for a non-thinking model; a thinking model's own thinking block (as SFT samples
    lay it out); None where a thinking model wrote no thinking that parsed (no trained context: no CE)."""
    if prompt_format not in THINKING_FORMATS:
        return ""
    if thinking is None:
        return None
    return f"{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n\n"
