"""Configuration of `simulacra filter`: SPEC.md's trajectory- and turn-level rules.

Every rule has its thresholds here; setting a rule's field to None turns that rule off.
"""

import re

from pydantic import Field, field_validator

from pipeline.config.base import Section

DEFAULT_ENVIRONMENT_FAILURE_PATTERNS = [
    # Harness and container failures: the environment, not the agent, broke.
    r"(?i)\benvironment (crashed|error|died)\b",
    r"(?i)\bcontainer (crashed|exited unexpectedly|is not running)\b",
    r"(?i)\bconnection (refused|reset by peer)\b.*\b(sandbox|runtime|environment)\b",
    r"(?i)\b(harness|runtime|episode|command) timed? ?out\b",
    r"(?i)\bTimeoutError: .*(sandbox|runtime|harness)",
    # Missing state: the environment lost what the trajectory depends on.
    r"(?i)\bsnapshot (not found|missing)\b",
    r"(?i)\bstate (file )?(not found|missing|corrupted)\b",
    # Web blockers: CAPTCHAs and HTTP error pages instead of content.
    r"(?i)\bcaptcha\b",
    r"(?i)\bverify (that )?you are (a )?human\b",
    r"(?i)\b(HTTP|status)[ /]?(1\.[01] )?(500|502|503|504)\b",
    r"(?i)\b(502 Bad Gateway|503 Service Unavailable|504 Gateway Time-?out|500 Internal Server Error)\b",
]

DEFAULT_MALFORMED_ACTION_PATTERNS = [
    # Observations a harness returns when the agent's action could not be parsed or run at all.
    r"(?i)^\s*(error: )?(invalid|malformed|unparseable|unrecognized) (action|command|tool call|json|format)",
    r"(?i)your (output|response|action) was not formatted correctly",
    r"(?i)^\s*(error: )?(unknown|no such) (tool|function|action)\b",
    r"(?i)please (always )?(provide|include) exactly one (bash )?(code block|action|command)",
    r"(?i)failed to parse (the )?(tool call|function call|action|arguments)",
    # Not ALFWorld's "Nothing happens.": that is the game's real answer to an action it cannot
    # carry out, and predicting it is part of simulating the game. A retry cycle is an action the
    # harness rejected before it reached the environment.
]


class FilterConfig(Section):
    min_turns: int | None = Field(
        default=2,
        ge=1,
        description="Drop trajectories with fewer turns (SPEC: fewer than 2), counted after the turn rules "
        "removed theirs. A single turn gives no history to condition on.",
    )
    check_action_space: bool | None = Field(
        default=True,
        description="Drop tool-call trajectories that call a tool missing from their declared action space "
        "(a model trained on them learns to answer tools that do not exist). Trajectories that declare "
        "no tools, turns without a tool name and turns already removed are not checked.",
    )
    environment_failure_patterns: list[str] | None = Field(
        default_factory=lambda: list(DEFAULT_ENVIRONMENT_FAILURE_PATTERNS),
        description="Regular expressions; an observation matching any of them marks the whole trajectory as "
        "hit by an environment failure (crash, missing state, CAPTCHA, HTTP error page, harness timeout). "
        "Every turn is searched, removed ones too. None disables the rule.",
    )
    environment_failure_max_chars: int = Field(
        default=2_000,
        ge=1,
        description="Only observations up to this length are searched for environment failures: a long "
        "page that merely mentions 'captcha' or '503' is content, a short one is the failure itself.",
    )
    drop_empty_actions: bool | None = Field(
        default=True, description="Remove turns whose action is empty or whitespace."
    )
    malformed_action_patterns: list[str] | None = Field(
        default_factory=lambda: list(DEFAULT_MALFORMED_ACTION_PATTERNS),
        description="Regular expressions (Python `re`, searched anywhere unless anchored) matched against a "
        "turn's observation: a match, or a turn flagged `is_error` with metadata `kind: format_error` by its "
        "adapter, marks a malformed action whose (action, observation) pair is dropped as a retry cycle when a "
        "later kept turn follows (the retry). None disables retry-cycle removal.",
    )
    gui_domains: list[str] | None = Field(
        default_factory=lambda: ["web", "android", "os"],
        description="Domains whose turns are dropped when the observation equals the previous kept one, "
        "whitespace-normalised (the action changed nothing on screen). None disables the rule.",
    )

    @field_validator("environment_failure_patterns", "malformed_action_patterns")
    @classmethod
    def _compiles(cls, patterns: list[str] | None) -> list[str] | None:
        for index, pattern in enumerate(patterns or []):
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {index} ({pattern!r}) is not a valid regular expression: {exc}") from None
        return patterns
