"""Credentials kept out of what `simulacra serve` answers, streamed or whole, logprobs included.

A served world model's answers are an agent's observations, and an agent's trajectories are its training
samples: a key the model recites (from the history it was sent, an `env` the agent ran with its own key set, or
its own training data) must not reach them. An answer is redacted as every answer the LLM client reads is
(`secret_spans`, pipeline/llm/credentials.py). A streamed one cannot be taken back once sent, so it is shown only
as far as no later token can change its redaction (`settled_length`): a credential is a run of key characters (the
alphabets of pipeline/secret_shapes.py, a masked key's `*` and `...`, every character of a key this process read),
so the end of a growing answer that is such a run is held back until a character no key holds arrives; so are the
lead of a shape that crosses a space (`Bearer `, `aws_secret_access_key = `) and a private key's block while it is
open. No credential crosses a settled cut, so the redaction of the text up to a later cut extends the one shown:
the deltas add up to the whole answer's redaction, and none holds a key's characters. Logprobs follow the same cuts
over the tokens' own texts: a token that is part of a credential is sent as `REDACTED` (the token its span starts
in) or as an empty string, without alternatives.
"""

import re
import string
from dataclasses import dataclass, field

from pipeline.llm import credentials
from pipeline.llm.batching import TokenLogprob
from pipeline.secret_shapes import (
    AWS_SECRET_NAME,
    PRIVATE_KEY_BLOCK,
    QUOTES,
    REDACTED,
    URL_PASSWORD_CHARACTER,
    URL_SCHEME,
    URL_USER_CHARACTER,
)

_KEY_CHARACTERS = frozenset(string.ascii_letters + string.digits + "_-.~+/=*\u2026\u2022")
# The leads of the shapes that cross spaces or quotes (pipeline/secret_shapes.py): `bearer` and spaces; AWS's secret
# key's name and as much of its separator as has come (`"SecretAccessKey": "`, `aws_secret_access_key = `); a URL
# from its scheme to as much of its user and password as has come (`postgres:/`, `postgres://admin:S3c`), until
# something no URL's user or password holds shows it is none.
_SEPARATOR_CHARACTERS = frozenset(string.whitespace + "\\\"':=")
_NAME_ENDING = re.compile(AWS_SECRET_NAME + r"\Z")
_SEPARATOR_SO_FAR = re.compile(QUOTES + r"\s*(?:[:=]\s*" + QUOTES + ")?")  # NAME_SEPARATOR as far as it has come
_LONGEST_NAME = 32  # characters a name may span (`aws_secret_access_key` is 21): where to look for one
_SCHEME_ENDING = re.compile(URL_SCHEME + r"\Z")
_SCHEME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "+")
_USER_AND_PASSWORD_SO_FAR = re.compile(f"{URL_USER_CHARACTER}*(?::{URL_PASSWORD_CHARACTER}*)?")
_KEY_BLOCK_BEGIN = re.compile(r"-----BEGIN ")
_KEY_BLOCK_HEADER = re.compile(r"-----BEGIN ([A-Z ]*)-----")
_PRIVATE_HEADER = re.compile(r"PRIVATE KEY(?: BLOCK)?\Z")
_KEY_BLOCK = re.compile(PRIVATE_KEY_BLOCK)


def _open_lead(text: str, cut: int) -> int | None:
    """Where a credential's lead starts when `text[:cut]` ends with one (`Bearer `, `aws_secret_access_key: `,
    `postgres://admin:`). Found from the end, over the separator's characters, so that a long run of spaces is no
    blind spot; a URL's from the last `://` (`_open_url`)."""
    at = cut
    while at and text[at - 1] in _SEPARATOR_CHARACTERS:
        at -= 1
    after = text[at:cut]
    start = at - len("bearer")
    if after and after.isspace() and start >= 0 and text[start:at].lower() == "bearer":
        if start == 0 or not (text[start - 1].isalnum() or text[start - 1] == "_"):  # the shape's `\b`
            return start
    name = _NAME_ENDING.search(text, max(0, at - _LONGEST_NAME), at)
    if name is not None and _SEPARATOR_SO_FAR.fullmatch(after):
        return name.start()
    return _open_url(text, cut)


def _scheme_start(text: str, end: int) -> int | None:
    """Where the URL scheme that ends at `end` starts (the shape's leftmost), or None."""
    start = end
    while start and text[start - 1] in _SCHEME_CHARACTERS:
        start -= 1
    found = _SCHEME_ENDING.search(text, start, end)
    return None if found is None else found.start()


def _open_url(text: str, cut: int) -> int | None:
    """Where a URL starts when `text[:cut]` ends inside its lead or password: `postgres:`, `postgres://admin:S3c`.
    Only the last `://` can be open (a user or password holds no `/`); before one, a scheme and its `:`."""
    at = text.rfind("://", 0, cut)
    if at != -1 and _USER_AND_PASSWORD_SO_FAR.fullmatch(text, at + 3, cut):
        return _scheme_start(text, at)
    if cut and text[cut - 1] == ":":  # `postgres:` whose `//` has not come (a `/` is held as a key character)
        return _scheme_start(text, cut - 1)
    return None


def settled_length(text: str, start: int = 0) -> int:
    """How much of a growing answer no text after it can change the redaction of. `start`: a length settled before,
    from where a private key's block is looked for (one that began earlier was closed by then)."""
    key_characters = _KEY_CHARACTERS | credentials.known_key_characters()
    cut = len(text)
    while True:
        while cut > start and text[cut - 1] in key_characters:
            cut -= 1
        lead = _open_lead(text, cut)
        if lead is None:
            break
        cut = max(start, lead)
        if lead <= start:
            break
        # A name needs no word break before it (`MY_SECRET_ACCESS_KEY=`): the run of key characters it ends, and a
        # lead that run may end in turn (a value glued to the next name), wait with it.
    for begin in _KEY_BLOCK_BEGIN.finditer(text, start, cut):
        block = text[begin.start() :]
        header = _KEY_BLOCK_HEADER.match(block)
        if header is not None and not _PRIVATE_HEADER.search(header.group(1)):
            continue  # a certificate or a public key
        if '"' in block or _KEY_BLOCK.match(block):
            continue  # closed (a whole block is a credential the next check sees), or stopped at a quote
        cut = begin.start()
        break
    # A credential already whole in the text may still end past the cut (a closed key block's last `-----`).
    for found_start, found_end in credentials.secret_spans(text[start:]):
        if found_start + start < cut < found_end + start:
            return found_start + start
    return cut


@dataclass
class SettledText:
    """A growing answer's text, shown redacted as far as it is settled."""

    cut: int = 0
    shown: str = ""  # the redaction of text[:cut]
    spans: list[tuple[int, int]] = field(default_factory=list)  # the credentials in text[:cut]

    def advance(self, text: str, final: bool) -> str:
        """The answer so far as it can be shown; at the end, the whole answer's redaction. No credential crosses a
        settled cut, so the part after the last one is redacted alone."""
        cut = len(text) if final else max(self.cut, settled_length(text, self.cut))
        if cut > self.cut:
            part = text[self.cut : cut]
            spans = credentials.secret_spans(part)
            self.spans += [(self.cut + a, self.cut + b) for a, b in spans]
            self.shown += credentials.replace_spans(part, spans)
            self.cut = cut
        return self.shown


@dataclass
class SettledTokens:
    """A growing answer's tokens with their texts, released once their text is settled."""

    text: str = ""
    settled: SettledText = field(default_factory=SettledText)
    pending: list[tuple[TokenLogprob, int, int]] = field(default_factory=list)  # token, its text's start and end

    def add(self, token: TokenLogprob, text: str) -> None:
        self.pending.append((token, len(self.text), len(self.text) + len(text)))
        self.text += text

    def release(self, final: bool) -> list[tuple[TokenLogprob, str | None]]:
        """The tokens whose text is settled, each with what replaces its text: None where it is no credential's."""
        self.settled.advance(self.text, final)
        released = []
        while self.pending and self.pending[0][2] <= self.settled.cut:
            token, begin, end = self.pending.pop(0)
            released.append((token, _replacement(begin, end, self.settled.spans)))
        return released


def redacted_tokens(tokens: list[tuple[TokenLogprob, str]]) -> list[tuple[TokenLogprob, str | None]]:
    """A whole answer's tokens, each with what replaces its text (None: its own)."""
    settled = SettledTokens()
    for token, text in tokens:
        settled.add(token, text)
    return settled.release(final=True)


def _replacement(begin: int, end: int, spans: list[tuple[int, int]]) -> str | None:
    """`REDACTED` for a token a credential starts in, "" for one it continues in, None for one it is not in."""
    inside = [(start, stop) for start, stop in spans if start < max(end, begin + 1) and begin < stop]
    if not inside:
        return None
    return REDACTED if any(begin <= start for start, _ in inside) else ""
