"""Draft tokens for a greedy row by prompt lookup: the tokens that followed the last occurrence of the row's
last few tokens, in its prompt or in what it has written.

A world model's answer copies much of its context: file names and log lines from the history, a JSON
record's keys, the `<|im_end|>` that closed every earlier observation, and (for a small model) its own
loops. Where the last n tokens (n from `LONGEST` down to 1) occurred before, what followed them then is
a good guess of what follows now. The decoder (pipeline/llm/batching.py) runs a row's guesses with its
next token in one forward pass and keeps those the model would have chosen itself, so a greedy answer is
the one the model writes token by token (vLLM's `ngram` speculative decoding and transformers'
`prompt_lookup_num_tokens` work so). Simulated on the demo's validation answers of its cpt checkpoint
(24 rows, 1,183 tokens): 4 guesses a step need 507 steps in place of 1,183, the longest row 66 in
place of 129.
"""

LONGEST = 3  # the longest n-gram looked up: longer ones rarely match where shorter ones miss

# A decoding step's cost in tokens' worth: about `STEP_OVERHEAD_TOKENS + tokens run` (every row runs as many as the
# longest draft, padded). On 2 cores with SmolLM2-135M a step took 0.23 s at 22 rows of one token and 0.44 s of five
# after 1,500-token prompts (a fixed part worth about 75 tokens), but 0.10 s at 5 rows of one and 0.21 s of five
# after 440-token prompts (about 14): at 48 an evaluation pass of the demo decoded slower with drafts than without
# (26.2-26.8 s against 21.8-24.4), at 16 faster (20.8-20.9), and a validation pass as fast as at 48 (12.4-13.6 s
# against 16.8-17.0 without). On a GPU the fixed part is worth far more.
STEP_OVERHEAD_TOKENS = 16


class PromptLookup:
    """One row's n-gram index over its tokens so far: for each n-gram (n <= `LONGEST`) the start of its latest
    occurrence that something followed. Kept up to date as the row grows, so a lookup is a dictionary read."""

    def __init__(self, tokens: list[int]):
        self.tokens: list[int] = []
        self._latest: dict[tuple[int, ...], int] = {}
        self.kept = self.refused = 0  # draft tokens the model agreed with; drafts cut short by one it did not
        self.proposed: list[int] = []  # a draft the step did not run: checked against the next token for free
        self.extend(tokens)

    @property
    def acceptance(self) -> float:
        """The chance that the next draft token is kept, given the one before was: the row's record so far,
        starting from even odds (a loop's is near 1, a row that writes something new near 0)."""
        return (self.kept + 1) / (self.kept + self.refused + 2)

    def record(self, drafted: int, kept: int, cut: bool) -> None:
        """A step's outcome: `kept` of `drafted` tokens, `cut` when a token the model did not choose ended it."""
        self.kept += kept
        self.refused += cut and kept < drafted

    def extend(self, tokens: list[int]) -> None:
        if self.proposed and tokens:
            # A guess not run is still a guess: its first token against the one the row wrote keeps the record
            # up to date while the batch is too full to run drafts, so a row in a loop is seen as one.
            self.record(1, int(tokens[0] == self.proposed[0]), tokens[0] != self.proposed[0])
        self.proposed = []
        for token in tokens:
            # The n-grams ending at the current last token are now followed by one: index them.
            end = len(self.tokens)
            for n in range(1, LONGEST + 1):
                if end >= n:
                    self._latest[tuple(self.tokens[end - n : end])] = end - n
            self.tokens.append(token)

    def draft(self, count: int) -> list[int]:
        """`count` tokens: those that followed the latest earlier occurrence of the longest n-gram the row ends
        with (and, where they run into the row's end, the same again); none when its last token never occurred
        before."""
        if count <= 0:
            return []
        end = len(self.tokens)
        for n in range(min(LONGEST, end), 0, -1):
            start = self._latest.get(tuple(self.tokens[-n:]))
            if start is not None:
                # Past the row's end the guess goes round again: a match `period` tokens back says the row repeats
                # with that period (a one-token loop guesses `count` more of it, not the one token written since).
                period = end - n - start
                draft = self.tokens[start + n : start + n + count]
                while len(draft) < count:
                    draft.append(draft[len(draft) - period])
                return draft
        return []


def step_width(drafts: list[list[int]], acceptance: list[float], overhead: float = STEP_OVERHEAD_TOKENS) -> int:
    """Tokens a row a step (its next token and its drafts, padded to the longest) that write the most tokens for
    the step's cost: each row's draft token i is kept with chance acceptance^i (the ones before it kept), and a
    step costs `overhead + rows x width` tokens' worth. Few rows, or rows in a loop: long drafts; a full batch of
    rows that write something new: one token a step."""
    rows = len(drafts)
    best, best_rate = 1, rows / (overhead + rows)
    for width in range(2, max(map(len, drafts), default=0) + 2):
        gain = sum(
            sum(chance**i for i in range(1, min(width - 1, len(draft)) + 1))
            for draft, chance in zip(drafts, acceptance)
        )
        rate = (rows + gain) / (overhead + rows * width)
        if rate > best_rate:
            best, best_rate = width, rate
    return best
