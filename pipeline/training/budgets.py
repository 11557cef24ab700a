"""Generation budgets checked against what they must hold (issue 16.4).

A budget shorter than its targets cannot succeed: RL with 48-token completions for answers that
close `</think>` only after 173-203 tokens gave every completion the same reward, every gradient 0,
and a checkpoint equal to its start, reported as "completed". So each generation budget (SFT's
generator and held-out answers, RL's completions and held-out answers, evaluation's predictions) is
compared, before any generation, with the 95th percentile of the lengths of the answers it is
measured on, in the model's own tokenizer: the observation, its end token, and for a thinking
model the thinking its SFT samples taught. A shorter budget stops the stage with one line naming
the field and the length needed.
"""

import json
import math
from collections.abc import Iterable
from pathlib import Path

from pipeline.errors import UserFixableError

# Beside a trained model folder (`<run>/model`): SFT records the token lengths its samples taught.
SFT_SAMPLING_FILE = "sampling.json"
THINKING_P95 = "thinking_tokens_p95"


class BudgetTooShort(UserFixableError):
    """A generation budget shorter than the answers it is measured on."""


def percentile_95(lengths: Iterable[int]) -> int:
    """The nearest-rank 95th percentile (0 for no lengths)."""
    ordered = sorted(lengths)
    if not ordered:
        return 0
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def answer_tokens(tokenizer, texts: Iterable[str]) -> list[int]:
    """Tokens of each answer as a model writes it: the text, then its end token."""
    return [len(tokenizer.encode(text, add_special_tokens=False)) + 1 for text in texts]


def thinking_allowance(model_ref: str) -> int:
    """The p95 thinking length (tokens, tags included) a model was taught, if an SFT run trained it
    or the model it descends from was so trained (SFT writes it beside its model folder); 0 for a model
    that answers without thinking."""
    sampling = Path(model_ref).parent / SFT_SAMPLING_FILE
    if sampling.is_file():
        return int(json.loads(sampling.read_text()).get(THINKING_P95, 0))
    return 0


def require_budget(field: str, configured: int, needed: int, what: str) -> None:
    """Stop with one line when `configured` tokens cannot hold the p95 answer (`needed`)."""
    if configured < needed:
        raise BudgetTooShort(
            f"{field} is {configured} tokens, but the p95 of {what} is {needed} tokens in the model's tokenizer: "
            f"raise {field} to at least {needed}"
        )
