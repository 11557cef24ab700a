"""Credentials recognisable by their shape, wherever they are not expected: in ingested trajectories (an agent's
shell that ran `env` or `cat ~/.aws/credentials`), in a config value (a key pasted where its variable's name
belongs), in a model's answer.

pipeline/llm/credentials.py redacts the keys this process was given, in every form; these shapes catch the keys
it was never given. Each shape is a provider's documented prefix with the length and alphabet of what follows, so
that ordinary text does not match: `disk-0123...` or a 40-character hex digest does not, `sk-` must start a word.
The same pattern serves Python's `re` and DuckDB's RE2 (ingest redacts in SQL, over whole batches).
"""

import re
from typing import Any

REDACTED = "[redacted-secret]"

_PRIVATE_KEY_HEADER = r"-----BEGIN [A-Z ]*PRIVATE KEY(?: BLOCK)?-----"
# A whole private key: what a growing answer's redaction waits for (pipeline/serving/answer_redaction.py).
PRIVATE_KEY_BLOCK = _PRIVATE_KEY_HEADER + r'[^"]*?-----END [A-Z ]*PRIVATE KEY(?: BLOCK)?-----'

SHAPES = {
    "OpenAI or Anthropic API key": r"\bsk-[A-Za-z0-9_\-]{20,}",
    "Hugging Face token": r"\bhf_[A-Za-z0-9]{30,}",
    "GitHub token": r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
    "AWS access key id": r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    "Google API key": r"\bAIza[0-9A-Za-z_\-]{35}",
    "Slack token": r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
    "Stripe secret key": r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}",
    "GitLab token": r"\bglpat-[A-Za-z0-9_\-]{20,}",
    "npm token": r"\bnpm_[A-Za-z0-9]{36}\b",
    "PyPI token": r"\bpypi-AgE[A-Za-z0-9_\-]{50,}",
    "SendGrid API key": r"\bSG\.[A-Za-z0-9_\-]{22}\.[A-Za-z0-9_\-]{43}",
    "Google OAuth access token": r"\bya29\.[A-Za-z0-9_\-]{20,}",
    "DigitalOcean token": r"\bdo[por]_v1_[a-f0-9]{64}\b",
    # A signed token's three parts; its header and claims are base64url JSON objects, so both begin `eyJ` (`{"`).
    "JSON Web Token": r"\beyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
    "Azure storage account key": r"\bAccountKey=[A-Za-z0-9+/]{40,}={0,2}",
    # An HTTP credential whatever issued it (`Authorization: Bearer ...` in a curl command or a log). Twenty
    # characters and more: a placeholder such as `$TOKEN` or `<token>` is left as written.
    "bearer token": r"\b(?i:bearer)\s+[A-Za-z0-9_\-.~+/]{20,}=*",
    # A PEM or PGP block (`-----BEGIN PGP PRIVATE KEY BLOCK-----`). Its body stops at a quote: inside JSON text (a
    # tool's arguments, a cached request) the replacement stays within one string, so the JSON stays valid however
    # the fields around it read. A block with no end line (`head id_rsa`, an observation cut at its length cap) is
    # a key too: from its header on, as far as the characters of a key's body and armour headers go (`\n` as JSON
    # text escapes it).
    "private key": PRIVATE_KEY_BLOCK + r"|" + _PRIVATE_KEY_HEADER + r"(?:[A-Za-z0-9+/=\s:,.-]|\\[nr])*",
}
# What may stand between a name and its value: quotes (backslashed where the text is itself a JSON string's), then
# `:` or `=`, then quotes again.
QUOTES = r"[\\\"\x27]*"
NAME_SEPARATOR = QUOTES + r"\s*[:=]\s*" + QUOTES
# A URL's scheme (`postgresql+psycopg2` too), its user and the `:` before its password (`postgres://admin:...@db`,
# `https://user:token@github.com`, none in `redis://:...@cache`). No length is bounded: a counted repetition made RE2
# 36x as slow over the same text (bench/redaction.py); a scheme of letters and digits from a word's start keeps
# Python's `re` to one scan of each word.
URL_SCHEME = r"\b[A-Za-z][A-Za-z0-9]*(?:\+[A-Za-z0-9]+)?"
# What a URL's user and its password may be made of (RE2 and Python alike; answer_redaction.py reads them too).
URL_USER_CHARACTER = r"[^\s/:@\"\x27\\]"
URL_PASSWORD_CHARACTER = r"[^\s/@\"\x27\\]"
URL_USER = URL_SCHEME + "://" + URL_USER_CHARACTER + "*:"
# Credentials known by what stands around them, not by a shape of their own: (lead, value, tail). The lead and the
# tail are kept and the value alone is replaced, so that JSON stays JSON and a URL a URL.
# - AWS's secret access key after its name, as a credentials file, the environment, an SDK's config
#   (`secretAccessKey`) and STS's JSON (`"SecretAccessKey": "..."`) write it; a value longer than 40 characters
#   keeps its tail.
# - A password in a URL, up to the `@` that ends it (a `DATABASE_URL` an agent's `env` printed).
AWS_SECRET_NAME = r"(?i:secret_?access_?key)"
URL_PASSWORD = "password in a URL"
NAMED = {
    "AWS secret access key": (AWS_SECRET_NAME + NAME_SEPARATOR, r"[A-Za-z0-9/+]{40}", ""),
    URL_PASSWORD: (URL_USER, URL_PASSWORD_CHARACTER + "+", "@"),
}
# The shapes of 2026-12-05, which migration 12 swept stores for; migration 13 sweeps again for the rest, and
# migration 14 for the named credentials' quoted forms, passwords in URLs, PGP blocks and private keys without an
# end line.
FIRST_SHAPES = (
    "OpenAI or Anthropic API key",
    "Hugging Face token",
    "GitHub token",
    "AWS access key id",
    "Google API key",
    "Slack token",
    "private key",
)
# The shapes that start a word share one `\b` in front of their alternation: Python's `re` then tries the
# alternation only where a word starts, where a `\b` in each branch had it try every branch at every character.
# bench/redaction.py: all 18 shapes, a `\b` per branch, 2.80x the time of the 7 before them; shared, 0.32x; RE2
# the same for all three. The same text matches either way.
_WORD_START = r"\b"
_AT_WORD_START = [shape.removeprefix(_WORD_START) for shape in SHAPES.values() if shape.startswith(_WORD_START)]
_ANYWHERE = [shape for shape in SHAPES.values() if not shape.startswith(_WORD_START)]
# The named credentials come first, each with two capturing groups, its lead and its tail: what a replacement keeps
# (`\1`..`\4` in RE2's rewrite, where a group that took no part is empty; the groups in Python's); every other shape
# is replaced whole.
NAMED_ALTERNATIVE = "|".join(f"(?:({lead}){value}({tail}))" for lead, value, tail in NAMED.values())
PATTERN = "|".join(
    [
        NAMED_ALTERNATIVE,
        _WORD_START + "(?:" + "|".join(f"(?:{shape})" for shape in _AT_WORD_START) + ")",
        *(f"(?:{s})" for s in _ANYWHERE),
    ]
)
SHAPE_PATTERN = re.compile(PATTERN)


def _named(found: re.Match) -> int | None:
    """Which named credential (its index in NAMED) `found` is, or None for a shape replaced whole."""
    return next((i for i in range(len(NAMED)) if found.group(2 * i + 1) is not None), None)


def secret_kind(text: str) -> str | None:
    """The kind of the first credential-shaped run in `text`, or None."""
    found = SHAPE_PATTERN.search(text)
    if found is None:
        return None
    named = _named(found)
    if named is not None:
        return list(NAMED)[named]
    return next(kind for kind, shape in SHAPES.items() if re.fullmatch(shape, found.group(0)))


def shape_spans(text: str) -> list[tuple[int, int]]:
    """Where `text` holds a credential-shaped run, as (start, end) spans: a named credential's value only."""
    spans = []
    for found in SHAPE_PATTERN.finditer(text):
        named = _named(found)
        spans.append(found.span() if named is None else (found.end(2 * named + 1), found.start(2 * named + 2)))
    return spans


def replacement(found: re.Match) -> str:
    """What replaces a match of PATTERN: REDACTED, between a named credential's lead and tail."""
    named = _named(found)
    return REDACTED if named is None else found.group(2 * named + 1) + REDACTED + found.group(2 * named + 2)


def redact_shapes(text: str) -> str:
    return SHAPE_PATTERN.sub(replacement, text)


def redact_value(value: Any) -> Any:
    """`value` with every string in it redacted, through lists and mappings (keys too): a tool schema, a turn's
    metadata, as ingest redacts their JSON columns."""
    if isinstance(value, str):
        return redact_shapes(value)
    if isinstance(value, list):
        return [redact_value(item) for item in value]
    if isinstance(value, dict):
        return {redact_value(key): redact_value(item) for key, item in value.items()}
    return value


_KEPT_LEADS = "".join(f"\\{2 * i + 1}" for i in range(len(NAMED)))
_KEPT_TAILS = "".join(f"\\{2 * i + 2}" for i in range(len(NAMED)))


def sql_redacted(column: str) -> str:
    """A DuckDB expression: `column` with every credential-shaped run replaced (RE2 reads the pattern as `re`
    does; the pattern holds no single quote, so it sits in a plain string literal, where a backslash is literal;
    the named credentials' kept leads and tails, `\\1`.., are empty for every other shape)."""
    return f"regexp_replace({column}, '{PATTERN}', '{_KEPT_LEADS}{REDACTED}{_KEPT_TAILS}', 'g')"


def sql_holds_secret(column: str) -> str:
    return f"coalesce(regexp_matches({column}, '{PATTERN}'), false)"


def sql_redact_rows(table: str, columns: tuple[str, ...], scope: str = "TRUE") -> str:
    """An UPDATE that redacts `columns` of the rows of `table` within `scope` (a condition) that hold a credential:
    one RE2 scan of the text, and only the matching rows rewritten."""
    holds = " OR ".join(sql_holds_secret(column) for column in columns)
    return f"UPDATE {table} SET {', '.join(f'{c} = {sql_redacted(c)}' for c in columns)} WHERE ({scope}) AND ({holds})"
