"""Control instructions: SPEC.md's four faults a simulator must be able to inject on request.

A world model used as a simulator for policy RL (SimRL) is asked, in the simulation-instructions
part of its prompt, to make the environment misbehave in a realistic way. RL teaches it to: a
configured share of prompts carries one instruction, and the judge is told which and scores whether
the prediction carries it out realistically for the domain (the reference shows the environment
without the fault, so it is a guide to content and format, not the answer).

Which prompt gets which instruction is a seeded hash of (seed, trajectory), no random generator, so
a rerun or a resumed run assigns the same ones; the stage records them (table `rl_prompts`).
"""

import hashlib
import re

CONTROLS: dict[str, str] = {
    "intermittent_api_error": (
        "Fault injection: for this action, the environment suffers an intermittent failure. Return the error "
        "this environment really returns for a transient fault (a timeout, a 503 / rate limit, a dropped "
        "connection, in its own format), not the normal result; a retry could succeed."
    ),
    "paginated_response": (
        "Fault injection: the environment paginates this response. Return only the first page of the result, "
        "in the environment's own format, with the marker it uses for more results (a next-page token or "
        "cursor, a 'more' prompt, a truncation notice with a count)."
    ),
    "incomplete_intermediate_result": (
        "Fault injection: the operation has not finished. Return the intermediate state the environment shows "
        "while it is still running (a pending or in-progress status, partial output so far, a job id to poll), "
        "not the final result."
    ),
    "partial_batch_failure": (
        "Fault injection: if this action does several things at once, some of them fail. Return a result in "
        "which part succeeded and part failed, each failure with the environment's own error for it; if the "
        "action is a single operation, fail a realistic part of its work."
    ),
}
KINDS = tuple(CONTROLS)


def draw_control(seed: int, trajectory_id: str, fraction: float) -> str | None:
    """The control instruction kind of one prompt, or None: a share `fraction` of prompts get one, the
    kinds equally likely, fixed by (seed, trajectory)."""
    key = f"{seed}\x1fcontrol\x1f{trajectory_id}".encode()
    value = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    share = (value >> 8) / float(1 << 56)  # uniform in [0, 1), independent of the low byte
    if share >= fraction:
        return None
    return KINDS[(value & 0xFF) % len(KINDS)]


# -- Did the prediction obey? -----------------------------------------------------------------------
# The offline judge compares a prediction with the reference, and the reference shows the environment
# *without* the fault: on a control prompt it would reward ignoring the instruction (issue 17, item 4).
# So a control prompt is scored by a rule per kind instead: the prediction must differ from the
# fault-free reference and show more of the fault's markers than the reference does (a reference that
# already says "running" does not make a copy of it an intermediate result). Markers are what real
# environments print for the fault, in English, case-insensitive.
TRANSIENT_ERROR = re.compile(
    r"(?i)\b(?:time[d -]?out|timed out|503|502|504|429|rate[ -]?limit(?:ed)?|too many requests|service unavailable|"
    r"temporarily unavailable|connection (?:reset|refused|dropped|closed|aborted|lost)|econnreset|etimedout|"
    r"econnrefused|try again|retry|retrying|transient|throttl\w*|bad gateway|gateway)\b"
)
MORE_PAGES = re.compile(
    r"(?i)next[_ -]?(?:page|cursor|token)|\bcursor\b|page[_ -]?token|has[_ -]?more|\bpage \d+ (?:of|/) \d+|"
    r"--more--|\(end\)|\bmore results\b|\b\d+ more\b|\bshowing \d+|\btruncated\b|\bpage[\"']?\s*[:=]|\boffset[\"']?\s*[:=]"
)
IN_PROGRESS = re.compile(
    r"(?i)\b(?:pending|in[ _-]?progress|running|queued|processing|still|not (?:yet )?(?:finished|complete|completed|done)|"
    r"partial|poll|job[_ -]?id|task[_ -]?id|accepted|started|starting|eta)\b|\b\d{1,2}(?:\.\d+)?\s?%"
)
FAILURE = re.compile(
    r"(?i)\b(?:errors?|failed|failures?|denied|not found|invalid|exception|rejected|conflict|unavailable|[45]\d\d)\b"
)
SUCCESS = re.compile(
    r"(?i)\b(?:ok|success|succeeded|successful(?:ly)?|created|updated|deleted|done|completed|saved|"
    r"passed|20[0-4]|true)\b"
)


def _shows_more(pattern: re.Pattern, prediction: str, reference: str) -> bool:
    return len(pattern.findall(prediction)) > len(pattern.findall(reference))


def obeys(kind: str, prediction: str, reference: str) -> bool:
    """Whether `prediction` carries out the control instruction `kind` against the fault-free `reference`."""
    if not prediction.strip() or prediction.strip() == reference.strip():
        return False
    if kind == "intermittent_api_error":
        return _shows_more(TRANSIENT_ERROR, prediction, reference)
    if kind == "paginated_response":
        return _shows_more(MORE_PAGES, prediction, reference)
    if kind == "incomplete_intermediate_result":
        return _shows_more(IN_PROGRESS, prediction, reference)
    if kind == "partial_batch_failure":  # part failed, and part did not
        return _shows_more(FAILURE, prediction, reference) and SUCCESS.search(prediction) is not None
    raise ValueError(f"unknown control instruction kind {kind!r} (known: {', '.join(KINDS)})")


def heldout_control(index: int) -> str:
    """The control kind the held-out query at `index` is asked with: the kinds in turn, so each is measured."""
    return KINDS[index % len(KINDS)]
