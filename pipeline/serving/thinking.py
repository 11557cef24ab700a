"""Separating a thinking model's answer into its thinking and the observation.

The thinking format is Qwen3's, `<think>\\n{thinking}\\n</think>\\n\\n{observation}` (pipeline/sft/candidates.py).
Serving is lenient where SFT's candidate parsing is strict: an agent wants an observation for
every step, so nothing is refused. What follows the first `</think>` is the observation (less up
to two newlines); an answer that opened a thinking block and never closed it (cut at the token
limit) is all thinking with an empty observation, never reasoning passed off as the environment's
output; an answer that does not open with `<think>` is all observation, a later `</think>` included
(the exported chat template opens no thinking block in the prompt, so a thinking answer opens its own;
and a streamed answer can then be shown as it comes, pipeline/serving/streaming.py). Only an answer
asked for in the thinking format is split: a direct one (issue 28) is the observation, whole.
"""

from pipeline.llm.thinking_format import THINK_CLOSE, THINK_OPEN


def split_thinking(text: str) -> tuple[str | None, str]:
    """(thinking or None, observation) of a model's answer."""
    body = text.lstrip()
    if not body.startswith(THINK_OPEN):
        return None, text
    rest = body[len(THINK_OPEN) :]
    if THINK_CLOSE not in rest:
        return rest.strip(), ""
    thinking, _, observation = rest.partition(THINK_CLOSE)
    for separator in ("\n\n", "\n"):
        if observation.startswith(separator):
            observation = observation[len(separator) :]
            break
    return thinking.strip(), observation
