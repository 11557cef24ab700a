"""Where a workspace lives: the DuckDB file, Prefect's home, run outputs and checkpoints."""

from pathlib import Path

from pydantic import Field

from pipeline.config.base import Section


class WorkspaceConfig(Section):
    path: Path = Field(
        default=Path("simulacra-workspace"),
        description="Folder holding the DuckDB store, Prefect's home, stage outputs and checkpoints. "
        "Relative paths resolve against the current folder, so every command works without a config file.",
    )
    database: str = Field(
        default="simulacra.duckdb",
        description="File name of the DuckDB store inside the workspace. One store per workspace.",
    )

    @property
    def root(self) -> Path:
        return self.path.expanduser().resolve()

    @property
    def database_path(self) -> Path:
        return self.root / self.database

    @property
    def prefect_home(self) -> Path:
        return self.root / "prefect"

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"
