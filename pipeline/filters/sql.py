"""Python's text semantics, spelled in DuckDB SQL, for the rules' SQL forms.

The rules' Python forms say "empty" with `str.strip()` and "the same words" with `str.split()`,
both over every character `str.isspace()` accepts (29 of them, `\\x1c`-`\\x1f`, U+0085 and
U+3000 among them). DuckDB's `trim()` removes spaces only and RE2's `\\s` is ASCII, so the set
is written out; tests/test_filter_rules.py re-derives it from Python. (`re`'s `\\s` is the same set.)
"""

from collections.abc import Sequence

import duckdb

PYTHON_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_WHITESPACE_CLASS = "[" + "".join(f"\\x{{{ord(char):x}}}" for char in PYTHON_WHITESPACE) + "]"
# A text is already " ".join(text.split()), but for a space at either end, unless it holds
# whitespace other than a space or two whitespace characters in a row. (DuckDB's `trim` removes
# spaces only, which is all that is left to remove then.)
_MORE_THAN_SPACES = (
    "["
    + "".join(f"\\x{{{ord(char):x}}}" for char in PYTHON_WHITESPACE if char != " ")
    + "]"
    + f"|{_WHITESPACE_CLASS}{{2}}"
)

# Temporary tables of a judging run start with this; the judge drops them all when it is done.
JUDGING_PREFIX = "judging_"


def no_rows(**columns: str) -> str:
    """A query with these columns (name=SQL type) and no row: what finds nothing answers."""
    return "SELECT " + ", ".join(f"NULL::{sql_type} AS {name}" for name, sql_type in columns.items()) + " WHERE false"


# What a turn rule that can find nothing answers.
NO_TURNS = no_rows(trajectory_id="VARCHAR", turn_index="INTEGER", reason="VARCHAR")


def quote(text: str) -> str:
    """`text` as a SQL string literal (standard SQL: no backslash escapes, quotes doubled)."""
    return "'" + text.replace("'", "''") + "'"


def is_blank(column: str) -> str:
    """True where `column.strip()` is empty. (RE2 over the class: ten times faster than DuckDB's
    `ltrim` with a set of characters.)"""
    return f"regexp_full_match({column}, {quote(_WHITESPACE_CLASS + '*')})"


def newlines_as_spaces(column: str) -> str:
    """`column` with every newline, and the whitespace after it, made one space: the same words,
    and most whitespace runs of a multi-line screen gone at little cost. RE2's replace costs a
    few microseconds per match, but jumps from one match to the next with memchr when the
    pattern starts with a fixed character; `words` then has few runs left to replace."""
    newline_run = quote(chr(10) + _WHITESPACE_CLASS + "*")
    return (
        f"CASE WHEN contains({column}, chr(10)) "
        f"THEN regexp_replace({column}, {newline_run}, ' ', 'g') ELSE {column} END"
    )


def words(column: str) -> str:
    """`" ".join(column.split())`: equal exactly when the two `split()` word lists are. A text
    whose only whitespace is single spaces is that already, once its end spaces are trimmed;
    only the others go through RE2's replace, and only texts with an end space are trimmed."""
    return (
        f"CASE WHEN regexp_matches({column}, {quote(_MORE_THAN_SPACES)}) "
        f"THEN trim(regexp_replace({column}, {quote(_WHITESPACE_CLASS + '+')}, ' ', 'g')) "
        f"WHEN starts_with({column}, ' ') OR ends_with({column}, ' ') THEN trim({column}) ELSE {column} END"
    )


def is_one_of(column: str, values: Sequence[str]) -> str:
    return f"{column} IN ({', '.join(quote(value) for value in values)})" if values else "false"


def judging_table(con: duckdb.DuckDBPyConnection, what: str, columns: dict[str, tuple[str, list]]) -> str:
    """A temporary table of rows Python computed, given as {column: (SQL type, values)}, dropped
    with the judging run's other tables; returns its name. (The lists go in as query parameters:
    building Arrow arrays from Python objects would import pandas, a third of a second.)"""
    name = JUDGING_PREFIX + what
    select = ", ".join(f"unnest(${column}::{sql_type}[]) AS {column}" for column, (sql_type, _) in columns.items())
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {name} AS SELECT {select}",
        {column: values for column, (_, values) in columns.items()},
    )
    return name
