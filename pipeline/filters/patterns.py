"""A list of regular expressions, and the cheap screen that finds the few texts they could match.

Python's `re` cannot skip ahead in patterns such as `(?i)\\bcaptcha\\b` or `^\\s*(invalid|...)`: it
tries every pattern at every position, about 40 us for one 250-character observation against the
default environment-failure list, which alone would cap the filter near 25k turns/s. RE2, the
engine of DuckDB's `regexp_matches`, runs a whole list as one DFA in a single pass over the text,
but it does not mean what `re` means: its `\\b` and `\\s` are ASCII where `re`'s are Unicode
("écaptcha" has no word boundary before the c for `re`), and its case folding lacks two of
`re`'s (dotless i and dotted capital I match `(?i)i` in `re` only).

So each pattern is rewritten, from `re`'s own parse of it, into an RE2 pattern that matches every
text the original matches and few others: word boundaries and lookarounds are left out (dropping
an assertion only widens a match), case-insensitive letters become classes with every character
`re` folds onto them, and whatever has no exact RE2 spelling (a backreference, `\\w`) becomes "any
character" or "anything". The screen, one alternation of them, runs in DuckDB over every
observation (pipeline/filters/loading.py); only the few texts it passes are searched with `re`,
so results are exactly those of searching every text with `re`.
"""

import re
from collections.abc import Sequence

import duckdb

from pipeline.errors import interrupted
from pipeline.filters.sql import PYTHON_WHITESPACE

# Non-ASCII characters that `re`'s IGNORECASE matches with an ASCII letter (U+0130 and U+0131
# with i, U+017F with s, the Kelvin sign U+212A with k), found by matching every code point
# against `(?i)` + each printable ASCII character; tests/test_filter_rules.py re-derives them.
_EXTRA_FOLDS = {"i": "\u0130\u0131", "k": "\u212a", "s": "\u017f"}
_ANY_CHAR = "(?s:.)"
_ANYTHING = "(?s:.*)"
# RE2 refuses counted repetitions above 1000; `{n,}` with a smaller n matches more, never less.
_RE2_MAX_REPEAT = 1000


class PatternSet:
    def __init__(self, patterns: Sequence[str]):
        self.patterns = [(pattern, re.compile(pattern)) for pattern in patterns]
        # None: no screen, every text is searched with `re`.
        self.screen = _screen([pattern for pattern, _ in self.patterns])

    def first_match(self, text: str) -> str | None:
        """The first pattern (its source) found in `text`, or None."""
        for pattern, compiled in self.patterns:
            if compiled.search(text) is not None:
                return pattern
        return None


def _screen(patterns: list[str]) -> str | None:
    supersets = [re2_superset(pattern) for pattern in patterns]
    if not supersets or None in supersets:
        return None
    screen = alternation(supersets)  # type: ignore[arg-type]  # None in supersets returned above
    # Too large for RE2's program limit: no screen rather than a wrong one.
    return screen if compiles_in_re2(screen) else None


def alternation(screens: Sequence[str]) -> str:
    return "|".join(f"(?:{screen})" for screen in screens)


def compiles_in_re2(screen: str) -> bool:
    try:
        with duckdb.connect() as con:
            con.execute("SELECT regexp_matches('', ?)", [screen]).fetchall()
    except duckdb.Error as exc:
        if interrupted(exc):  # ctrl-C is not a pattern RE2 refuses
            raise
        return False
    return True


def re2_superset(pattern: str) -> str | None:
    """An RE2 pattern matching (in a search) every text `pattern` matches with `re.search`; None
    when `re`'s parser (a private module) cannot be read: the cost is the speed-up only."""
    try:
        from re import _constants, _parser  # type: ignore[attr-defined]  # private: typeshed leaves them out

        parsed = _parser.parse(pattern)
        return _sequence(list(parsed), parsed.state.flags, _constants)
    except Exception:
        return None


def _sequence(items: list, flags: int, c) -> str:
    return "".join(_element(op, argument, flags, c) for op, argument in items)


def _element(op, argument, flags: int, c) -> str:
    ignorecase = bool(flags & re.IGNORECASE)
    if op is c.LITERAL:
        return _literal(argument, ignorecase)
    if op is c.NOT_LITERAL:
        return _ANY_CHAR if ignorecase else f"[^{_code(argument)}]"
    if op is c.ANY:
        return _ANY_CHAR if flags & re.DOTALL else "[^\\n]"
    if op is c.IN:
        return _class(argument, flags, c)
    if op is c.BRANCH:
        return "(?:" + "|".join(_sequence(list(branch), flags, c) for branch in argument[1]) + ")"
    if op is c.SUBPATTERN:
        _, add_flags, del_flags, sub = argument
        return "(?:" + _sequence(list(sub), (flags | add_flags) & ~del_flags, c) + ")"
    if op is c.ATOMIC_GROUP:
        return "(?:" + _sequence(list(argument), flags, c) + ")"
    if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
        low, high, sub = argument
        repeated = "(?:" + _sequence(list(sub), flags, c) + ")"
        low = min(low, _RE2_MAX_REPEAT)
        if high > _RE2_MAX_REPEAT:
            return f"{repeated}{{{low},}}"
        return f"{repeated}{{{low},{high}}}"
    if op is c.AT:
        if argument is c.AT_BEGINNING:
            return "(?m:^)" if flags & re.MULTILINE else "^"
        if argument is c.AT_BEGINNING_STRING:
            return "\\A"
        return ""  # \\b, \\B, $, \\Z only narrow a match: without them it matches more
    if op in (c.ASSERT, c.ASSERT_NOT):
        return ""
    return _ANYTHING  # a backreference or a conditional matches some text; this matches any


def _literal(code: int, ignorecase: bool) -> str:
    char = chr(code)
    if not ignorecase or (char.isascii() and not char.isalpha()):
        return _code(code)
    if not char.isascii():
        return _ANY_CHAR  # `re`'s case folds of non-ASCII characters are not written down here
    return "[" + "".join(_code(ord(folded)) for folded in _folds(char)) + "]"


def _folds(char: str) -> str:
    """The characters `re`'s IGNORECASE matches with the ASCII letter `char`."""
    return char.lower() + char.upper() + _EXTRA_FOLDS.get(char.lower(), "")


def _class(items: list, flags: int, c) -> str:
    ignorecase = bool(flags & re.IGNORECASE)
    negated = bool(items) and items[0][0] is c.NEGATE
    members = []
    for op, argument in items[1:] if negated else items:
        if op is c.LITERAL and (not ignorecase or chr(argument).isascii()):
            members.append(_code(argument))
            if ignorecase and chr(argument).isalpha():
                members.extend(_code(ord(folded)) for folded in _folds(chr(argument)))
        elif op is c.RANGE and (not ignorecase or argument[1] < 128):
            low, high = argument
            members.append(f"{_code(low)}-{_code(high)}")
            if ignorecase:
                letters = (chr(code) for code in range(low, high + 1) if chr(code).isalpha())
                members.extend(_code(ord(folded)) for letter in letters for folded in _folds(letter))
        elif op is c.CATEGORY and argument is c.CATEGORY_SPACE and not (negated and flags & re.ASCII):
            members.extend(_code(ord(char)) for char in PYTHON_WHITESPACE)
        else:
            return _ANY_CHAR
    if negated:
        # The complement of a case-folded set is not written down here either.
        return _ANY_CHAR if ignorecase else "[^" + "".join(members) + "]"
    return "[" + "".join(members) + "]"


def _code(code: int) -> str:
    return f"\\x{{{code:x}}}"
