"""What the exported model descends from, in the Hub's terms (issue 19, deliver 4), and the length it
was trained at (issue 17, item 17).

- `base_model`: the Hub id the training stages started from (`model.base` when it names a Hub
  repository rather than a local folder); None for the tiny offline model or a local folder, whose
  path means nothing on another machine.
- `license`: `export.license` when set; else the base model's own card's (its README's front matter,
  read from the local folder or the Hugging Face cache, never downloaded); the tiny offline model is
  built by this project from nothing, so it carries the project's licence; otherwise `other`, which
  the Hub accepts and the card explains.
- `context_length`: the longest sequence the exported checkpoint trained on (`cpt.max_length`; after SFT
  the longer of it and `sft.max_length`; RL trains from the SFT model on SFT-shaped prompts), capped at the architecture's
  maximum. A server that allows the architecture's 40,960 tokens lets a client send histories the model
  never saw; servers enforce this one.
- `max_history_chars`: the character budget of the history training gave each query (sft, rl), which
  the environment classes apply first, exactly as pipeline/sft/queries.py does; None for CPT windows,
  which are limited in tokens only.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

# The project's licence (pyproject.toml), that of a model it builds from random weights.
PROJECT_LICENSE = "apache-2.0"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Provenance:
    base_model: str | None
    license: str
    license_source: str  # where the licence was read, for the card


def hub_id(reference: str | None) -> str | None:
    """`reference` when it names a Hub repository (org/name that is no local folder)."""
    if reference is None or Path(reference).expanduser().exists() or not _HUB_ID.match(reference):
        return None
    return reference


def card_license(readme: Path) -> str | None:
    """The `license` of a model card's YAML front matter."""
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    if not text.startswith("---"):
        return None
    front = text[3:].split("\n---", 1)[0]
    try:
        meta = yaml.safe_load(front)
    except yaml.YAMLError:
        return None
    found = meta.get("license") if isinstance(meta, dict) else None
    return str(found) if found else None


def _cached_readme(repo_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "README.md")
    return Path(found) if isinstance(found, str) else None


def provenance(config) -> Provenance:
    from pipeline.training.gguf_base import PACKAGED_MODELS, gguf_license, is_gguf_ref

    base = config.model.base
    packaged = PACKAGED_MODELS.get(base.lower()) if base else None
    # A packaged model descends from its Hub repository: the demo's card said "the tiny offline model or a local
    # folder" of SmolLM2-135M-Instruct, and its licence "unknown".
    hub = packaged.hub_id if packaged else hub_id(base)
    if config.export.license:
        return Provenance(hub, config.export.license, "export.license")
    if base is None:
        return Provenance(None, PROJECT_LICENSE, "the tiny offline model, built by this project")
    if is_gguf_ref(base):
        found = gguf_license(base)
        if found:
            where = "the packaged base model's card" if packaged else "the base model's GGUF metadata"
            return Provenance(hub, found, where)
        return Provenance(hub, "other", "unknown: the base model's GGUF file names none; set export.license")
    readme = Path(base).expanduser() / "README.md" if hub is None else _cached_readme(hub)
    found = card_license(readme) if readme is not None else None
    if found:
        return Provenance(hub, found, "the base model's card")
    return Provenance(hub, "other", "unknown: the base model's card was not found; set export.license")


def context_length(config, stage: str | None, fmt_name: str, model_dir: Path) -> int:
    trained_by = stage if stage in ("cpt", "sft", "rl") else fmt_name
    # SFT and RL start from the CPT model: it has trained on CPT's windows too, and SFT's rows may be shorter.
    trained = config.cpt.max_length if trained_by == "cpt" else max(config.cpt.max_length, config.sft.max_length)
    return min(trained, architecture_length(model_dir))


def architecture_length(model_dir: Path) -> int:
    """The longest sequence the architecture takes (its position embeddings)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("n_positions") or 2048)


def max_history_chars(config, stage: str | None, fmt_name: str) -> int | None:
    trained_by = stage if stage in ("cpt", "sft", "rl") else fmt_name
    if trained_by == "rl":
        return config.rl.max_history_chars
    if trained_by == "sft":
        return config.sft.max_history_chars
    return None
