"""Ending a generated row that has fallen into a loop: one short unit of tokens repeated, over and over.

A small model (the demo's 135M one, a freshly trained checkpoint) often ends an observation by
repeating a phrase (`The towel is sprayed into the towel.` forty times) until `max_tokens`. `generate`
runs a batch until its longest row stops, so one looping row costs the whole batch its full budget,
on CPU minutes a batch. A row whose last `window` tokens are one unit of at most `window // 4` tokens
repeated (each token equal to the one a unit earlier, so at least four repeats) is ended there: what it
would write next is more of the same, and its text up to that point is kept as its answer.

A real observation can repeat too (`yes | head -100`), so the window is long (default 64 tokens:
16 repeats of a one-token unit, four of a 16-token line); an endpoint sets `stop_on_repetition: null`
to generate every row to its own end.
"""

from transformers import StoppingCriteria


def repeating(tokens: list[int], window: int) -> bool:
    """Whether the last `window` tokens are one unit of at most `window // 4` tokens repeated."""
    if len(tokens) < window + 1:
        return False
    for period in range(1, window // 4 + 1):
        if len(tokens) < window + period:
            break
        if all(tokens[-i] == tokens[-i - period] for i in range(1, window + 1)):
            return True
    return False


class RepetitionStop(StoppingCriteria):
    """A stopping criterion for `generate` (per row): True for the rows that are `repeating` in what they
    generated (the prompt's own repetitions never count)."""

    def __init__(self, prompt_length: int, window: int):
        super().__init__()
        self.prompt_length = prompt_length
        self.window = window

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        generated = input_ids[:, self.prompt_length :]
        if generated.shape[1] <= self.window:
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        tails = generated[:, -(self.window + self.window // 4) :].tolist()
        return torch.tensor([repeating(tail, self.window) for tail in tails], dtype=torch.bool, device=input_ids.device)
