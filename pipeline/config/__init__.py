"""One YAML file, one typed section per stage.

`load_config(None)` gives the defaults, so every command works with no config file at all.
A wrong key or value raises `ConfigError` naming the file, the field and what was expected,
before any work starts.
"""

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError
from pydantic_core import ErrorDetails

from pipeline.config.answers import AnswersConfig
from pipeline.config.base import Section
from pipeline.config.cpt import CPTConfig
from pipeline.config.evaluate import EvaluateConfig
from pipeline.config.export import ExportConfig
from pipeline.config.fidelity import FidelityConfig
from pipeline.config.filter import FilterConfig
from pipeline.config.ingest import IngestConfig
from pipeline.config.llm import CREDENTIALS_IN_URL
from pipeline.config.model import ModelConfig
from pipeline.config.orchestration import OrchestrationConfig
from pipeline.config.rl import RLConfig
from pipeline.config.score import ScoreConfig
from pipeline.config.sft import SFTConfig
from pipeline.config.split import SplitConfig
from pipeline.config.validation import ValidationConfig
from pipeline.config.workspace import WorkspaceConfig
from pipeline.secret_shapes import URL_PASSWORD, secret_kind


class SimulacraConfig(Section):
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig, description="Store and outputs.")
    ingest: IngestConfig = Field(default_factory=IngestConfig, description="Trajectory sources.")
    filter: FilterConfig = Field(default_factory=FilterConfig, description="Trajectory and turn rules.")
    score: ScoreConfig = Field(default_factory=ScoreConfig, description="Turn informativeness.")
    split: SplitConfig = Field(default_factory=SplitConfig, description="Disjoint pools and targets.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Base model for training.")
    answers: AnswersConfig = Field(default_factory=AnswersConfig, description="Thinking or direct answers.")
    validation: ValidationConfig = Field(
        default_factory=ValidationConfig, description="The validation pool's score, before and after each stage."
    )
    cpt: CPTConfig = Field(default_factory=CPTConfig, description="Continual pretraining.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Rejection-sampled SFT.")
    rl: RLConfig = Field(default_factory=RLConfig, description="GSPO reinforcement learning.")
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig, description="Evaluation of every checkpoint.")
    fidelity: FidelityConfig = Field(
        default_factory=FidelityConfig, description="Closed-loop fidelity and policy agreement of every simulator."
    )
    export: ExportConfig = Field(default_factory=ExportConfig, description="The world-model checkpoint.")
    orchestration: OrchestrationConfig = Field(default_factory=OrchestrationConfig, description="Stage DAG.")

    def section_hash(self, name: str) -> str:
        """Stable hash of one section's values: part of that stage's fingerprint."""
        payload = json.dumps(getattr(self, name).model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class ConfigError(ValueError):
    """A configuration problem, with the file and field it concerns."""


def _describe(error: ErrorDetails) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"field `{field}`: unknown key (misspelt? see `simulacra config --defaults` for valid keys)"
    if kind == "missing":
        return f"field `{field}`: required but missing"
    if kind == CREDENTIALS_IN_URL:  # the value is the secret: never shown
        return f"field `{field}`: {error['msg']}"
    given = error.get("input")
    shown = repr(given) if not isinstance(given, dict) else "a mapping"
    return f"field `{field}`: {error['msg']} (got {shown})"


def _overlay(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _overlay(merged[key], value)
        else:
            merged[key] = value
    return merged


def parse_override(text: str) -> dict[str, Any]:
    """`cpt.max_steps=5` -> {"cpt": {"max_steps": 5}}; the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY.PATH=VALUE")
    path, raw = text.split("=", 1)
    try:
        value: Any = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        # The value is not quoted back: an override may hold what the credential check below would refuse.
        raise ConfigError(
            f"override `{path.strip()}`: its value is not valid YAML{yaml_problem(exc)}; quote it for a string "
            f"(--set '{path.strip()}=\"...\"')"
        ) from None
    for part in reversed(path.strip().split(".")):
        value = {part: value}
    return value


def yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message on one line, with 1-based positions: its own spans five lines, names the text "<unicode
    string>" and points a caret at a line the user has in their editor anyway."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem is None or mark is None:
        return f": {' '.join(str(exc).split())}"
    text = f" at line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, started = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and started is not None:
        text += f" ({context} at line {started.line + 1}, column {started.column + 1})"
    elif context:
        text += f" ({context})"
    return text


def _credential_fields(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(field, kind) for every string in the raw config that has a credential's shape, lists included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _credential_fields(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _credential_fields(item, f"{path}.{index}")
    elif isinstance(value, str) and (kind := secret_kind(value)) is not None:
        if kind == URL_PASSWORD and path.endswith("base_url"):
            return  # an endpoint's own check refuses it, naming the variable its key belongs in (config/llm.py)
        yield path or "(top level)", kind


def _refuse_credentials(raw: dict[str, Any], where: str) -> None:
    """A key pasted into the config (into `api_key_env`, where its variable's name belongs, say) would be stored
    wherever the config goes: section hashes, fingerprints, Prefect's flow-run parameters, logs. Refused before
    validation, so that no validation message quotes it either; the value is never shown."""
    found = list(_credential_fields(raw))
    if found:
        lines = "\n".join(
            f"  field `{field}`: holds a credential by its shape ({kind}): a credential never goes in the config; "
            "put it in the environment variable `api_key_env` names, or in a Prefect Secret block (`api_key_secret`)"
            for field, kind in found
        )
        raise ConfigError(f"{where}: invalid configuration\n{lines}")


def load_config(path: str | Path | None = None, overrides: list[dict[str, Any]] | None = None) -> SimulacraConfig:
    raw: dict[str, Any] = {}
    where = "<defaults>"
    if path is not None:
        file = Path(path)
        where = str(file)
        if file.is_dir():
            raise ConfigError(f"{where}: a folder, not a config file: name the YAML file in it")
        if not file.is_file():
            raise ConfigError(f"{where}: config file not found")
        try:
            loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML{yaml_problem(exc)}") from exc
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where}: not UTF-8 (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): save it as UTF-8"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{where}: could not be read ({exc.strerror or exc}): make it readable") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{where}: expected a mapping of sections at the top level, got {type(loaded).__name__}")
        raw = loaded
    for override in overrides or []:
        raw = _overlay(raw, override)
    if overrides:
        where += " (with overrides)"
    _refuse_credentials(raw, where)
    try:
        return SimulacraConfig.model_validate(raw)
    except ValidationError as exc:
        lines = "\n".join(f"  {_describe(e)}" for e in exc.errors())
        raise ConfigError(f"{where}: invalid configuration\n{lines}") from None
