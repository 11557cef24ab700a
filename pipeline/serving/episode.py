"""What an episode in a simulated environment is for: its task, when it ends and what it earns
(issue 19, deliver 3), shared by the gymnasium and TRL environments.

An episode is given by the user, never guessed: the task and the other system-prompt parts, and any
of three ends:
- `verifier`: Python source defining `verify(observation: str) -> bool`, the rule reward's kind of
  code (pipeline/rewards/rule.py), run in its sandbox on each observation: True ends the episode
  with success;
- `success_pattern`: a regular expression searched in each observation: a match is success;
- `max_steps`: the step limit: reaching it truncates the episode (gymnasium's `truncated`).
Reward is sparse: 1.0 on the step that succeeds, 0.0 otherwise, so the return of an episode is
whether the task was done. `seed` makes the episode reproducible: step t's request carries a seed
derived from (episode seed, t), so the same actions get the same observations.

`episode_fields` checks the fields a reset (or an episode file, `read_episode`) gives: a misspelt field is
refused with the names an episode takes, not ignored; `checked_ends` an episode's ends, however it was built.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.errors import UserFixableError
from pipeline.store.schema import SystemPrompt

SUCCESS_REWARD = 1.0
SYSTEM_PARTS = ("action_space", "tools", "initial_state", "demonstrations", "simulation_instructions")
TEXT_PARTS = tuple(part for part in SYSTEM_PARTS if part != "tools")  # tools are a list of schemas
# Every name an episode is given by (`from_mapping`); a caller that must refuse misspelt ones checks against it.
EPISODE_FIELDS = ("task", "task_description", *SYSTEM_PARTS, "verifier", "success_pattern", "max_steps")


@dataclass(frozen=True)
class EpisodeSpec:
    task: str
    system: SystemPrompt = field(default_factory=SystemPrompt)  # the other parts; its task_description is ignored
    verifier: str | None = None
    success_pattern: str | None = None
    max_steps: int | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "EpisodeSpec":
        """From a dataset row or gymnasium `options`: `task`, the system parts by name, and the ends. A field of
        the wrong type is a ValueError naming it: a list given as the task was asked as its Python repr, a mapping
        as the initial state was a 500 of OpenEnv's server, and `max_steps: 2.7` was 2."""
        for name in ("task", "task_description", *TEXT_PARTS, "verifier", "success_pattern"):
            if values.get(name) is not None and not isinstance(values[name], str):
                raise ValueError(f"`{name}` must be text, not {type(values[name]).__name__}")
        tools = values.get("tools")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(tool, dict) for tool in tools)):
            raise ValueError("`tools` must be a list of tool schemas (mappings), as a chat request's `tools`")
        parts = {name: values[name] for name in SYSTEM_PARTS if values.get(name) is not None}
        return cls(
            task=values.get("task") or values.get("task_description") or "",
            system=SystemPrompt(**parts),
            verifier=values.get("verifier") or None,
            success_pattern=values.get("success_pattern") or None,
            max_steps=_whole_number("max_steps", values.get("max_steps")),
        )


def _whole_number(name: str, value: Any) -> int | None:
    """An integer as JSON, YAML or a dataset column gives one (`3`, `3.0`, `"3"`); None stays None."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be a whole number, not {value!r}")
    return value


class EpisodeError(ValueError):
    """A reset or step the episode cannot take; `status` is its HTTP answer on OpenEnv's stateless routes."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def episode_from_options(options: Mapping[str, Any], default: EpisodeSpec | None) -> EpisodeSpec:
    """The episode a reset's `options` describe, or `default` when they are empty; a task is required (OpenEnv's
    resets and episode files: an agent is never handed an episode without one)."""
    episode = episode_fields(options) if options else default
    if episode is None or not episode.task:
        raise EpisodeError(
            "no task: pass `task` (and the episode's other fields) to reset, or start the server with --episode FILE"
        )
    return episode


def episode_fields(options: Mapping[str, Any]) -> EpisodeSpec:
    """The episode `options` give by name, each field checked: a misspelt one is refused with the names an episode
    takes (a gymnasium reset took `{"tsak": ...}` as an episode with no task at all), and the ends as
    `checked_ends` checks them."""
    unknown = sorted(set(options) - set(EPISODE_FIELDS))
    if unknown:
        raise EpisodeError(
            f"unknown episode field(s) {', '.join(unknown)}: an episode takes "
            f"{', '.join(EPISODE_FIELDS)} (and reset a seed and an episode_id)"
        )
    try:
        episode = EpisodeSpec.from_mapping(options)
    except (TypeError, ValueError) as exc:
        raise EpisodeError(f"a bad episode field: {exc}") from None
    return checked_ends(episode)


def checked_ends(episode: EpisodeSpec) -> EpisodeSpec:
    """`episode`, once its ends can work: a step limit of 1 or more, a success pattern that compiles."""
    if episode.max_steps is not None and episode.max_steps < 1:  # else every step ends the episode as truncated
        raise EpisodeError(f"max_steps is {episode.max_steps}: an episode takes at least 1 step, or none for no limit")
    if episode.success_pattern:
        try:
            re.compile(episode.success_pattern)
        except re.error as exc:
            raise EpisodeError(
                f"success_pattern {episode.success_pattern!r} is not a regular expression: {exc}"
            ) from None
    return episode


def read_episode(path: Path) -> EpisodeSpec:
    """A server's default episode from a YAML (or JSON) mapping of the fields a reset takes."""
    import yaml

    from pipeline.config import yaml_problem

    try:
        values = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:  # one line, as a config's: PyYAML's own spans five, a caret among them
        raise UserFixableError(f"cannot read the episode {path}: not valid YAML{yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserFixableError(f"cannot read the episode {path}: {exc}") from None
    if not isinstance(values, dict) or not (values.get("task") or values.get("task_description")):
        raise UserFixableError(f"{path} is not a mapping of episode fields with a `task` ({', '.join(EPISODE_FIELDS)})")
    try:
        return episode_from_options(values, None)
    except EpisodeError as exc:
        raise UserFixableError(f"{path}: {exc}") from None


def step_seed(episode_seed: int, step: int) -> int:
    """The request seed of step `step` of an episode: a stable function of both."""
    digest = hashlib.blake2b(f"{episode_seed}\x1f{step}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


@dataclass(frozen=True)
class Outcome:
    reward: float
    terminated: bool  # the task is done
    truncated: bool  # the step limit ended it first
    reason: str


def judge(spec: EpisodeSpec, observation: str, steps_taken: int, sandbox_config=None) -> Outcome:
    """The outcome of the step that produced `observation`, the `steps_taken`-th of the episode."""
    if spec.success_pattern and re.search(spec.success_pattern, observation):
        return Outcome(SUCCESS_REWARD, True, False, f"the observation matches {spec.success_pattern!r}")
    if spec.verifier:
        from pipeline.config.sandbox import SandboxConfig
        from pipeline.rewards.rule import rule_reward

        verdict = rule_reward(spec.verifier, observation, sandbox_config or SandboxConfig())
        if verdict.status == "pass":
            return Outcome(SUCCESS_REWARD, True, False, f"the verifier passed: {verdict.reason}")
        reason = f"the verifier did not pass ({verdict.status}: {verdict.reason})"
    else:
        reason = "no end reached"
    if spec.max_steps is not None and steps_taken >= spec.max_steps:
        return Outcome(0.0, False, True, f"the step limit of {spec.max_steps} was reached; {reason}")
    return Outcome(0.0, False, False, reason)
