"""How each model is asked and teacher-forced: the template of the stage that trained it, in the answer
format it was trained in (issue 17, item 14; issue 28, hybrid thinking; pipeline/prompts/answer_format.py).

- `non-thinking`: base and CPT checkpoints, CPT's fixed template (pipeline/prompts/cpt.py). The answer
  is the observation itself; teacher forcing puts the real observation right after the assistant header.
- `thinking` / `direct`: SFT checkpoints, SFT template 0 (pipeline/prompts/sft.py; one of the ten SFT
  trains on) asking for its format: a `<think>` block then the observation, extracted strictly
  (pipeline/sft/candidates.py) so that only the observation reaches the judge and the metrics; or the
  observation alone.
- `rl-thinking` / `rl-direct`: RL checkpoints, RL's own fixed template without a control instruction
  (pipeline/prompts/rl.py), the format RL trains and the export serves.
A direct answer is in its format unless it writes a thinking tag (`think_tag_in_direct`).

Teacher forcing in a thinking format conditions the real observation on the model's own thinking when
its answer parsed: SFT samples always train a non-empty thinking block before the observation, so a
thinking model has never seen an observation after an empty block, and forcing one there would
measure a format it was not trained in. Where the answer did not parse there is no such context: that
row has no cross-entropy (the table counts the rows that have one, `ce_rows`). A direct model is forced
as a non-thinking one, the real observation right after the assistant header.
A checkpoint given by path and not registered is asked as its `answer_format.json` says, else as a base
model unless `--thinking` says otherwise (then as an SFT thinking checkpoint).
"""

from pipeline.prompts.answer_format import FORMATS, answer_format
from pipeline.prompts.answer_format import NON_THINKING as _NON_THINKING
from pipeline.sft.candidates import THINK_CLOSE, THINK_OPEN
from pipeline.sft.queries import Query, chat_messages

NON_THINKING = "non-thinking"
THINKING = "thinking"
DIRECT = "direct"
RL_THINKING = "rl-thinking"
RL_DIRECT = "rl-direct"
RETRIEVAL = "retrieval"
THINKING_FORMATS = tuple(name for name, fmt in FORMATS.items() if fmt.thinking)
assert _NON_THINKING.name == NON_THINKING


def system_prompt(query: Query, prompt_format: str) -> str:
    return answer_format(prompt_format).system_prompt(query.domain, query.system)


def query_messages(query: Query, prompt_format: str, own_system: str | None = None) -> tuple[dict[str, str], ...]:
    """System prompt (a benchmark item's own when it carries one, verbatim: the benchmark defines it), the
    kept history as user (action) / assistant (observation) turns, the action."""
    return chat_messages(query, own_system if own_system is not None else system_prompt(query, prompt_format))


def extract_observation(text: str | None, prompt_format: str) -> tuple[str, str | None, str | None]:
    """(parse status, predicted observation, thinking) of a model's answer in its format. A direct answer
    is the observation as written (an empty one included: `mkdir x` prints nothing)."""
    parsed = answer_format(prompt_format).parse(text)
    return parsed.status, parsed.prediction, parsed.thinking


def answer_prefix(prompt_format: str, thinking: str | None) -> str | None:
    """What precedes the observation in the assistant turn under teacher forcing, in the format the model
    trained in: nothing for a direct model; a thinking model's own thinking block (as SFT samples
    lay it out); None where a thinking model wrote no thinking that parsed (no trained context: no CE)."""
    if prompt_format not in THINKING_FORMATS:
        return ""
    if thinking is None:
        return None
    return f"{THINK_OPEN}\n{thinking}\n{THINK_CLOSE}\n\n"
