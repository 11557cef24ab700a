"""What every stage returns, so the CLI, the flows and `stage_runs` read results one way."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class StageResult:
    stage: str
    metrics: dict[str, Any] = field(default_factory=dict)
    output_path: Path | None = None
    summary: str = ""
    # Tables and figures for the Prefect UI: {artifact key: markdown table rows or PNG path}.
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    images: dict[str, Path] = field(default_factory=dict)
