"""The deployments `simulacra server start` registers: deploy/prefect.yaml bound to one project
folder and one workspace.

The project folder is the folder the command runs in (or `--project-dir`), never the folder the
`simulacra` package happens to be installed from: an editable install of another checkout, or a
wheel with no deploy/ beside it at all, must not decide where flow runs execute or what they
write (issue 8, item 5). Each deployment that runs on this machine's process workers (those
without a pull step of their own; the GPU image deployments have one) gets:

- an explicit `set_working_directory` pull step to the project folder, so the deployment records
  where its flow runs execute;
- an absolute `config_path`: the config `server start` was given, or else the deployment's own
  (relative to the project folder);
- an absolute `workspace`: the server's workspace, so runs triggered from the UI, the CLI run in
  the project folder, and the server's Prefect home all use one store.

The bound file is written to the workspace's Prefect home (`deployments.yaml`) and deployed from
there, with the project folder as the working directory (entrypoints are relative to it).
"""

from pathlib import Path
from typing import Any

import yaml

PREFECT_FILE = Path("deploy") / "prefect.yaml"
BOUND_FILE = "deployments.yaml"


class _PlainDumper(yaml.SafeDumper):
    """Writes a value shared by several deployments (a YAML anchor in prefect.yaml) in full each time."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


class NotAProject(ValueError):
    """The folder holds no deploy/prefect.yaml: not a Simulacra project folder."""


def project_folder(path: Path | None = None) -> Path:
    """The project folder: `path`, or the current folder; it must hold deploy/prefect.yaml."""
    folder = (path or Path.cwd()).expanduser().resolve()
    if not (folder / PREFECT_FILE).is_file():
        hint = (
            "pass the project folder with --project-dir"
            if path
            else "run the command in the project folder, or pass --project-dir"
        )
        raise NotAProject(f"{folder} is not a Simulacra project folder (no {PREFECT_FILE}): {hint}")
    return folder


def bind(spec: dict[str, Any], project: Path, workspace: Path, config_path: Path | None) -> dict[str, Any]:
    """deploy/prefect.yaml's content with every deployment that runs from the project folder bound
    to it and to the workspace (module docstring). The project folder's own GPU-stage deployment
    gets the pull step only: the dispatching pipeline hands it config and workspace."""
    for deployment in spec["deployments"]:
        if deployment.get("pull") is not None:
            continue
        deployment["pull"] = [{"prefect.deployments.steps.set_working_directory": {"directory": str(project)}}]
        parameters = deployment.get("parameters") or {}
        if "config_path" in parameters:
            config = config_path or project / parameters["config_path"]
            deployment["parameters"] = {**parameters, "config_path": str(config), "workspace": str(workspace)}
    return spec


def write_bound(project: Path, workspace: Path, config_path: Path | None, prefect_home: Path) -> Path:
    """The bound deployments file, in the Prefect home (where the server's logs are too)."""
    spec = yaml.safe_load((project / PREFECT_FILE).read_text(encoding="utf-8"))
    bound = bind(spec, project, workspace, config_path)
    target = prefect_home / BOUND_FILE
    header = f"# Written by `simulacra server start` from {project / PREFECT_FILE}; edit that file, not this one.\n"
    target.write_text(header + yaml.dump(bound, Dumper=_PlainDumper, sort_keys=False), encoding="utf-8")
    return target
