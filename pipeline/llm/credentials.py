"""Where the API key comes from, and keeping it out of everything written.

The key lives in the process only: in the SDK client's header. It is never a config field, never
in the cache key, the store, a log line or an exception message. Every key `api_key` hands out is
remembered for this process, and `redact` replaces every recognisable form of every one of them:
the key verbatim or backwards, and the masked forms servers quote back (OpenAI's 401 says
`sk-canar****...2ad4`: a prefix, a run of `*`/`.`/`…`, a suffix; or only one of the two ends). It
runs over every error text that leaves a backend and over every answer (an endpoint behind a
debugging proxy may echo the Authorization header into its answer): what the store, the logs, the
judge and training see holds `REDACTED` instead, and a sample that held a secret is never trained
on (pipeline/sft/candidates.py). A base URL is shown without user info or query, and a configured
one may hold neither (pipeline/config/llm.py): credentials belong in the environment.
"""

import os
import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

from pipeline.config.llm import EndpointConfig
from pipeline.secret_shapes import REDACTED, shape_spans

# A masked key's hidden middle: at least three mask characters (asterisks, dots, ellipses, bullets).
_MASK_RUN = re.compile(r"[*.\u2026\u2022]{3,}")
# The shortest key end that counts as recognisable next to a mask: "sk-" alone names the key's kind, a
# 4-character suffix is what OpenAI shows. Shorter ends would match ordinary text ("a..." in prose).
_MIN_PREFIX = 3
_MIN_SUFFIX = 4
# Keys shorter than this are not masked-matched (their ends would be most of the key and match prose);
# their verbatim form is still replaced.
_MIN_KEY = 12

_known: set[str] = set()


class MissingSecret(RuntimeError):
    """The configured Prefect Secret block could not be read."""


def api_key(endpoint: EndpointConfig) -> str | None:
    """The Prefect Secret block when `api_key_secret` is set, else the `api_key_env` variable, else None.
    The key is remembered, so `redact` replaces it wherever this process writes text."""
    key = _read_key(endpoint)
    if key:
        remember_secret(key)
    return key


def _read_key(endpoint: EndpointConfig) -> str | None:
    if endpoint.api_key_secret:
        from prefect.blocks.system import Secret

        try:
            return str(Secret.load(endpoint.api_key_secret).get())  # type: ignore[union-attr]  # sync call: the block, not a coroutine
        except ValueError as exc:  # Prefect's "Unable to find block document named ..."
            raise MissingSecret(
                f"api_key_secret: cannot read Prefect Secret block {endpoint.api_key_secret!r} ({exc}); "
                f"create it with `prefect block create secret` or in the UI"
            ) from None
    if endpoint.api_key_env:
        return os.environ.get(endpoint.api_key_env) or None
    return None


def remember_secret(secret: str) -> None:
    _known.add(secret)


def known_key_characters() -> set[str]:
    """Every character of the keys this process read: what a streamed answer holds back while a key may be coming
    (pipeline/serving/answer_redaction.py)."""
    return set().union(*_known)


def remember_environment_keys(endpoints: Iterable[EndpointConfig]) -> None:
    """Remember the key each endpoint reads from the environment before any client is opened, so that `redact`
    replaces it in what is stored first (a flow run's overrides, flows/stored_parameters.py). A Prefect Secret
    block's key is left to the client that reads it: reading one means a call to the server."""
    for endpoint in endpoints:
        if endpoint.api_key_env and (key := os.environ.get(endpoint.api_key_env)):
            remember_secret(key)


def _visible_prefix(text: str, end: int, secret: str) -> int:
    """Length of the longest prefix of `secret` that ends at `end` in `text` (0 below the minimum).
    Found from where the key's first characters occur just before, not by trying every length."""
    head = secret[:_MIN_PREFIX]
    at = text.find(head, max(0, end - len(secret) + 1), end)
    while at != -1:
        if secret.startswith(text[at:end]):
            return end - at
        at = text.find(head, at + 1, end)
    return 0


def _visible_suffix(text: str, start: int, secret: str) -> int:
    """Length of the longest suffix of `secret` that starts at `start` in `text` (0 below the minimum)."""
    tail = secret[-_MIN_SUFFIX:]
    at = text.rfind(tail, start, start + len(secret) - 1)
    while at != -1:
        if secret.endswith(text[start : at + len(tail)]):
            return at + len(tail) - start
        at = text.rfind(tail, start, at + len(tail) - 1)
    return 0


def _masked_spans(text: str, secret: str) -> list[tuple[int, int]]:
    """Each mask run with a recognisable end of `secret` beside it, ends included. Scans the mask runs and compares
    their neighbours, rather than one regex alternative per prefix length: linear in the text, and `redact` runs on
    every answer."""
    spans: list[tuple[int, int]] = []
    for run in _MASK_RUN.finditer(text):
        before = _visible_prefix(text, run.start(), secret)
        after = _visible_suffix(text, run.end(), secret)
        if (before or after) and (not spans or run.start() - before >= spans[-1][1]):
            spans.append((run.start() - before, run.end() + after))
    return spans


def _occurrences(text: str, part: str) -> Iterator[tuple[int, int]]:
    if not part:
        return
    at = text.find(part)
    while at != -1:
        yield at, at + len(part)
        at = text.find(part, at + len(part))


def secret_spans(text: str, secret: str | None = None) -> list[tuple[int, int]]:
    """Where `text` holds a credential, as sorted (start, end) spans that do not overlap: every form of `secret` and
    of every key this process read, and every credential-shaped run (pipeline/secret_shapes.py): a key this process
    never read, which an endpoint quotes from its own environment or a model recites from its training data. Spans
    rather than a replaced text, so that what covers a span can be told too: the tokens of a served answer's
    logprobs (pipeline/serving/answer_redaction.py)."""
    found = shape_spans(text)
    for key in _known | ({secret} if secret else set()):
        found += _occurrences(text, key)
        if len(key) >= _MIN_KEY:
            # Written backwards (an answer asked to disguise the key, issue 29.9): no prose spells a long key so.
            found += _occurrences(text, key[::-1])
            found += _masked_spans(text, key)
    merged: list[tuple[int, int]] = []
    for start, end in sorted(found):
        if merged and start < merged[-1][1]:  # overlapping forms are one span
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def redact(text: str, secret: str | None = None) -> str:
    """`text` with each of its `secret_spans` replaced by `REDACTED`."""
    return replace_spans(text, secret_spans(text, secret))


def replace_spans(text: str, spans: list[tuple[int, int]]) -> str:
    pieces, kept_to = [], 0
    for start, end in spans:
        pieces += [text[kept_to:start], REDACTED]
        kept_to = end
    return "".join(pieces) + text[kept_to:] if pieces else text


def public_url(url: str) -> str:
    """`https://user:pw@host/v1?key=x` -> `https://host/v1`."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
