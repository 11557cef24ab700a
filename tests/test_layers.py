"""The layering the code keeps: flows -> stages -> pipeline, and inside pipeline the store at the bottom.

Imports are read from the source (every `import`, a function's deferred ones included), so a lazy import
that would close a cycle at run time is caught as well as a module-level one.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "stages", "flows")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))}


def imported(module: str) -> set[str]:
    """The project modules `module` imports (`from a.b import c` counts a.b, and a.b.c when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text(), str(MODULES[module]))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name in MODULES and name != module}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(importer: str, allowed: tuple[str, ...]) -> list[str]:
    """`importer`'s modules importing a project module outside `allowed` (and outside `importer` itself)."""
    return sorted(
        f"{module} imports {target}"
        for module in MODULES
        if within(module, importer)
        for target in imported(module)
        if not within(target, importer) and not any(within(target, package) for package in allowed)
    )


def test_the_store_imports_only_configuration_and_errors():
    # The store holds rows; what training, prompts or formats make of them is theirs (a snapshot
    # yields ScoredTurns, a record the store defines, and ingestion expands its own inputs).
    # Migration 12 redacts credentials by their shapes (a leaf module, below).
    assert (
        violations("pipeline.store", ("pipeline.config", "pipeline.errors", "pipeline.stage", "pipeline.secret_shapes"))
        == []
    )


def test_the_llm_clients_know_no_stage_method():
    # The backends read the thinking tags from pipeline/llm/thinking_format.py, not from SFT.
    assert (
        violations(
            "pipeline.llm",
            (
                "pipeline.config",
                "pipeline.errors",
                "pipeline.progress",
                "pipeline.secret_shapes",  # what a credential looks like: a leaf (below)
                "pipeline.store",
                "pipeline.training",
                "pipeline.serving",
            ),
        )
        == []
    )


def test_the_credential_shapes_import_nothing_of_the_project():
    # Ingest, the config loader and the LLM clients all redact with them: a leaf, so no layer is wrong to use it.
    assert imported("pipeline.secret_shapes") == set()


@pytest.mark.parametrize(("lower", "higher"), [("stages", "flows"), ("pipeline", "stages"), ("pipeline", "flows")])
def test_no_layer_imports_one_above_it(lower, higher):
    # pipeline/cli.py is the entry point above every layer: the one module of pipeline that runs stages and flows.
    found = [
        line
        for line in violations(lower, tuple(p for p in PACKAGES if p != higher))
        if not line.startswith("pipeline.cli ")
    ]
    assert found == []


def test_flows_import_one_another_without_a_cycle():
    graph = {m: {t for t in imported(m) if within(t, "flows")} for m in MODULES if within(m, "flows")}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            assert state.get(target) != "open", f"import cycle: {' -> '.join(path + [module, target])}"
            if target not in state:
                visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_the_reader_sees_deferred_imports():
    # flows/dag.py imports the GPU pool's flow inside a function: the graph must hold that edge.
    assert "flows.gpu_stage" in imported("flows.dag")
