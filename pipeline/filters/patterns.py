"""A list of regular expressions searched over the observations of many trajectories at once.

Python's `re` cannot skip ahead in patterns such as `(?i)\\bcaptcha\\b` or `^\\s*(invalid|...)`: it
tries every pattern at every position, about 40 us for one 250-character observation against the
default environment-failure list, which alone would cap the filter near 25k turns/s. Nearly every
pattern needs some literal text to match, though ("captcha", "bad gateway"). `PatternSet` reads
those required literals from `re`'s own parse of each pattern and looks for all of them in one
vectorised pass (Arrow's RE2 over a literal alternation, a DFA whose speed does not depend on the
number of literals); only the few observations that contain one are searched with the patterns.
The screen never rejects a text a pattern would match: literals are ASCII, compared with the same
case folding `re` applies, so results are exactly those of searching every text with `re`.
"""

import re
from collections.abc import Sequence

from pipeline.schema import Trajectory

# Non-ASCII characters that `re`'s IGNORECASE matches with an ASCII letter (U+0130 and U+0131
# with i, U+017F with s, the Kelvin sign U+212A with k), found by matching every code point
# against `(?i)` + each printable ASCII character; tests/test_filter_rules.py re-derives them.
_EXTRA_FOLDS = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}

# Alternatives (text, case-insensitive?) of which every match of a pattern contains one.
Requirement = frozenset[tuple[str, bool]]


class PatternSet:
    def __init__(self, patterns: Sequence[str]):
        self.patterns = [(pattern, re.compile(pattern)) for pattern in patterns]
        requirements = [_required_literals(pattern) for pattern in patterns]
        # One pattern without a required literal could match anything: then no screen at all.
        self.screen = _alternation(requirements) if requirements and None not in requirements else None

    def first_match(self, text: str) -> str | None:
        """The first pattern (its source) found in `text`, or None."""
        for pattern, compiled in self.patterns:
            if compiled.search(text) is not None:
                return pattern
        return None

    def search_all(self, texts: list[str]) -> dict[int, str]:
        """{position in `texts`: first matching pattern} for the texts that match."""
        if not self.patterns:
            return {}
        candidates = range(len(texts)) if self.screen is None else self._screened(texts)
        found = {}
        for position in candidates:
            pattern = self.first_match(texts[position])
            if pattern is not None:
                found[position] = pattern
        return found

    def search_observations(
        self, trajectories: Sequence[Trajectory], max_chars: int | None = None
    ) -> dict[tuple[int, int], str]:
        """{(position in `trajectories`, turn index): first matching pattern} over every turn's
        observation, skipping observations longer than `max_chars`."""
        texts = [turn.observation for trajectory in trajectories for turn in trajectory.turns]
        owners = [(position, index) for position, t in enumerate(trajectories) for index in range(len(t.turns))]
        if max_chars is not None:
            short = [i for i, text in enumerate(texts) if len(text) <= max_chars]
            texts = [texts[i] for i in short]
            owners = [owners[i] for i in short]
        return {owners[i]: pattern for i, pattern in self.search_all(texts).items()}

    def _screened(self, texts: list[str]) -> list[int]:
        import pyarrow as pa
        import pyarrow.compute as pc

        hits = pc.match_substring_regex(pa.array(texts, pa.large_string()), self.screen)
        return pc.indices_nonzero(hits).to_pylist()


def _alternation(requirements: list[Requirement]) -> str:
    """An RE2 pattern matching any text that contains one of the literals."""
    literals = sorted(set().union(*requirements))
    return "|".join("".join(_re2_char(char, folded) for char in text) for text, folded in literals)


def _re2_char(char: str, folded: bool) -> str:
    if char.isascii() and char.isalpha():
        if not folded:
            return char
        return f"[{char.lower()}{char.upper()}{_EXTRA_FOLDS.get(char.lower(), '')}]"
    return f"\\x{{{ord(char):x}}}"


def _required_literals(pattern: str) -> Requirement | None:
    """Literal texts one of which every match of `pattern` contains; None when there are none.
    Reads the parse tree of `re` (a private module): should its shape change, the only cost is
    the speed-up."""
    try:
        from re import _constants as c, _parser

        parsed = _parser.parse(pattern)
        return _sequence(list(parsed), bool(parsed.state.flags & re.IGNORECASE), c)
    except Exception:
        return None


def _sequence(items: list, ignorecase: bool, c) -> Requirement | None:
    """Each element of a sequence is required; the most selective requirement among them wins."""
    candidates: list[Requirement] = []
    run: list[str] = []

    def close_run() -> None:
        if run:
            text = "".join(run)
            candidates.append(frozenset({(text.lower() if ignorecase else text, ignorecase)}))
            run.clear()

    for op, argument in items:
        if op is c.LITERAL and argument < 128:
            run.append(chr(argument))
            continue
        close_run()
        if op is c.SUBPATTERN:
            _, add_flags, del_flags, sub = argument
            scoped = (ignorecase or bool(add_flags & re.IGNORECASE)) and not del_flags & re.IGNORECASE
            found = _sequence(list(sub), scoped, c)
        elif op is c.BRANCH:
            branches = [_sequence(list(branch), ignorecase, c) for branch in argument[1]]
            found = None if None in branches else frozenset().union(*branches)
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and argument[0] >= 1:
            found = _sequence(list(argument[2]), ignorecase, c)
        elif op is c.ATOMIC_GROUP:
            found = _sequence(list(argument), ignorecase, c)
        else:
            found = None
        if found:
            candidates.append(found)
    close_run()
    if not candidates:
        return None
    # The longest shortest alternative, then the fewest alternatives: the rarest in real text.
    return max(candidates, key=lambda r: (min(len(text) for text, _ in r), -len(r)))
