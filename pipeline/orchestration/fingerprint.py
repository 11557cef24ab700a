"""A stage's fingerprint: the hash that decides whether its completed output can be reused.

DESIGN.md ("Data flow"): every stage is a function of its config sections, the fingerprints of its
inputs and the code version; the triple hashes to the fingerprint. Here:

- config: `config.section_hash(name)` of each section the stage reads (defaults included);
- inputs: what the stage reads, measured where it lives. Source files by path and content
  (sha256, cached by stat identity: pipeline/store/content_digests.py); store relations by `store.table_fingerprint` over the columns that
  carry meaning (ids are content hashes, so a trajectory's text cannot change under its id);
  the base model by its identity. Measuring the data itself rather than chaining upstream
  fingerprints means a stage run from the CLI, by the nightly refresh or by a flow all count;
- code: the package version and a digest of the source of every project module the stage's
  module imports, directly or not (stages/cpt.py alone would miss a change to
  pipeline/training/sequences.py).

A later stage (sft, rl, evaluate, fidelity, export) adds one entry to `STAGE_INPUTS`.
"""

import ast
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pipeline.config import SimulacraConfig
from pipeline.formats.sources import expand_source
from pipeline.store.content_digests import ContentDigests
from pipeline.store.database import Store

PROJECT_ROOT = Path(__file__).resolve().parents[2]
PROJECT_PACKAGES = ("pipeline", "stages")

InputProbe = Callable[[SimulacraConfig, Store], dict[str, str]]


@dataclass(frozen=True)
class StageInputs:
    sections: tuple[str, ...]  # config sections the stage reads
    probe: InputProbe  # fingerprints of what it reads outside the config


def relations(*read: tuple[str, str]) -> InputProbe:
    """Fingerprints of store relations, each given as (relation, columns that matter)."""
    return lambda config, store: {relation: store.table_fingerprint(relation, columns) for relation, columns in read}


def source_files(specs: list[str], digests: ContentDigests, names: list[str] | None = None) -> str:
    """Digest of the inputs the specs expand to, by path and bytes: a new, removed or edited file
    changes it, whatever its size and times (issue 8.4); an unchanged one is not read again. `names`: the
    configured sources the specs are the paths of, named in the error when one is not there."""
    digest = hashlib.sha256()
    for index, spec in enumerate(specs):
        digest.update(spec.encode() + b"\0")
        for item in expand_source(spec, names[index] if names else None):
            content = item.digest() if item.is_hf else digests.sha256(Path(item.path))
            digest.update(f"{item.path}\0{content}\0".encode())
    return digest.hexdigest()[:16]


def _ingest_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    with ContentDigests.of_workspace(config.workspace.root) as digests:
        sources = config.ingest.sources
        return {"sources": source_files([s.path for s in sources], digests, [s.name for s in sources])}


def _cpt_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    # Imported here: they bring numpy and polars, which the data stages do not need.
    from pipeline.informativeness import SCORER_VERSION
    from pipeline.store.snapshot import pools_fingerprint
    from pipeline.training.models import base_model_identity
    from pipeline.training.world_knowledge import corpus_fingerprint

    # The tiny model is built from the model section and the cpt pool, both covered already.
    # The keep ratios are read from turn_scores: the pools' fingerprint covers their values, the `score`
    # section (in `sections`) and the scorer version say which config they must have been computed
    # under. So a changed score config is a new CPT run, which stops until `simulacra score` has run
    # (snapshot.require_scores) instead of passing as done (issue 13).
    with ContentDigests.of_workspace(config.workspace.root) as digests:
        world_knowledge = corpus_fingerprint(config.cpt.world_knowledge, digests)
        base = base_model_identity(config, digests)
    return {
        "pools": pools_fingerprint(store, ("cpt", "val")),
        "validation_targets": _validation_targets(store),
        "scorer_version": SCORER_VERSION,
        "world_knowledge": world_knowledge,
        "base_model": base,
    }


def _validation_targets(store: Store) -> str:
    return store.table_fingerprint("(SELECT * FROM targets WHERE pool = 'val') AS t", "trajectory_id, turn_index")


def _sft_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    from pipeline.sft.base_model import NoCPTCheckpoint, sft_base_ref
    from pipeline.sft.rationale import rationale_prompt_digest
    from pipeline.sft.sampling import generator_prompt_digest, judge_files_digest
    from pipeline.store.snapshot import pools_fingerprint
    from pipeline.training.models import model_identity

    try:
        base = model_identity(sft_base_ref(config, store))
    except NoCPTCheckpoint:
        base = "no-cpt-checkpoint"  # the stage itself stops with the reason
    return {
        "pools": pools_fingerprint(store, ("cpt", "sft", "val")),
        "targets": store.table_fingerprint(
            "(SELECT * FROM targets WHERE pool IN ('sft', 'val')) AS t", "trajectory_id, turn_index, pool"
        ),
        "base_model": base,
        # The held-out CE is measured on CPT's validation windows: these settings shape them.
        "eval_windows": f"{config.cpt.max_length}:{config.cpt.eval_max_sequences}:{config.cpt.seed}",
        # Prompts and rubrics are data files, not modules: the code digest does not see them.
        "prompts": generator_prompt_digest() + rationale_prompt_digest() + judge_files_digest(),
    }


def _rl_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    from pipeline.rewards.rubrics import files_digest, prompt_path, rubric_files
    from pipeline.rl.base_model import NoBaseModel, rl_base_ref
    from pipeline.store.snapshot import pools_fingerprint
    from pipeline.training.models import model_identity

    try:
        base = model_identity(rl_base_ref(config, store))
    except NoBaseModel:
        base = "no-base-model"  # the stage itself stops with the reason
    return {
        "pools": pools_fingerprint(store, ("rl", "val")),
        "targets": store.table_fingerprint(
            "(SELECT * FROM targets WHERE pool IN ('rl', 'val')) AS t", "trajectory_id, turn_index, pool"
        ),
        # Verifier code lives in turn metadata, which the turn ids do not hash.
        "verifiers": store.table_fingerprint(
            "(SELECT u.trajectory_id, u.turn_index, u.metadata FROM turns u JOIN targets t USING (trajectory_id, turn_index) "
            "WHERE t.pool = 'rl' AND u.metadata IS NOT NULL) AS v",
            "trajectory_id, turn_index, metadata",
        ),
        "base_model": base,
        # The judge's prompts and rubrics are data files, not modules: the code digest does not see them.
        "prompts": files_digest(rubric_files() + [prompt_path("sft_judge_pointwise"), prompt_path("rl_judge_control")]),
    }


def _export_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    from pipeline.serving.export_source import NothingToExport, resolve_source
    from pipeline.training.models import model_identity

    try:
        source = resolve_source(config, store)
        checkpoint = f"{source.checkpoint_id}:{source.stage}:{model_identity(str(source.path))}"
    except NothingToExport:
        checkpoint = "none"  # the stage itself stops with the reason
    return {
        "checkpoint": checkpoint,
        # The model card reports these: the sources, the pools and every stage's latest completed run.
        "trajectories": store.table_fingerprint("trajectories", "trajectory_id, source, format"),
        "pools": store.table_fingerprint("splits", "trajectory_id, pool"),
        "stage_runs": store.table_fingerprint(
            "(SELECT DISTINCT stage, fingerprint FROM stage_runs WHERE status = 'completed' AND stage != 'export') AS r",
            "stage, fingerprint",
        ),
        "evaluations": store.table_fingerprint("(SELECT * FROM evaluations WHERE completed) AS e", "evaluation_id"),
        # The card quotes the exported model's fidelity numbers (`simulacra fidelity` from the CLI too).
        "fidelity": store.table_fingerprint("fidelity_reports", "report_id, checkpoint_id"),
    }


def _evaluate_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    from pipeline.evaluation.tagged_judge import prompts_digest
    from pipeline.sft.sampling import judge_files_digest
    from pipeline.store.snapshot import pools_fingerprint
    from pipeline.training.models import base_model_identity, base_model_ref, model_identity

    with ContentDigests.of_workspace(config.workspace.root) as digests:
        # The tiny model by its folder: it exists only once CPT built it, and only then is it evaluated.
        base = (
            base_model_identity(config, digests)
            if config.model.base is not None
            else model_identity(base_model_ref(config))
        )
    return {
        # The eval pool's queries, the cpt pool the retrieval baseline copies from, and the training pools
        # that decide which targets are seen in training.
        "pools": pools_fingerprint(store, ("cpt", "sft", "rl", "eval")),
        "targets": store.table_fingerprint(
            "(SELECT * FROM targets WHERE pool = 'eval') AS t", "trajectory_id, turn_index"
        ),
        # Every registered checkpoint: a new one (rl, a retrained sft) is a new row of the table. Not the
        # exports: they are copies of a trained checkpoint (never evaluated twice), and export follows
        # evaluate, so counting them would make each run of the pipeline invalidate the next.
        "checkpoints": store.table_fingerprint(
            # Not the path: a moved workspace re-registers its checkpoints under the new one.
            "(SELECT * FROM checkpoints WHERE stage <> 'export') AS c",
            "checkpoint_id, fingerprint",
        ),
        "base_model": base,
        # Rubrics and judge prompts are data files, not modules: the code digest does not see them.
        "prompts": f"{judge_files_digest()}+{prompts_digest()}",
    }


def _fidelity_inputs(config: SimulacraConfig, store: Store) -> dict[str, str]:
    from pipeline.store.snapshot import pools_fingerprint

    evaluate = config.evaluate
    # Fidelity measures the models evaluation measures (`evaluate.checkpoints`), its rollouts asked and judged as
    # evaluation asks and judges: these of its settings, not its query budget.
    asked = [
        evaluate.checkpoints,
        evaluate.predictor.model_dump(mode="json"),
        evaluate.max_history_chars,
        evaluate.judge.model_dump(mode="json"),
        evaluate.judge_prompt,
        evaluate.semantic_match_threshold,
        evaluate.baseline_history_turns,
    ]
    return {
        # What evaluate reads (the eval pool, the checkpoints, the base model, the judge's files), the cpt pool
        # the baseline copies from, not the training pools that decide evaluation's seen targets.
        **_evaluate_inputs(config, store),
        "pools": pools_fingerprint(store, ("cpt", "eval")),
        "asked_as_evaluate": hashlib.sha256(json.dumps(asked, sort_keys=True).encode()).hexdigest()[:16],
    }


# Turn ids are content hashes: the key columns identify the text as well.
KEPT_TURNS = ("kept_turns", "trajectory_id, turn_index")

STAGE_INPUTS: dict[str, StageInputs] = {
    "ingest": StageInputs(("ingest",), _ingest_inputs),
    "filter": StageInputs(("filter",), relations(("trajectories", "trajectory_id"))),
    "score": StageInputs(("score",), relations(KEPT_TURNS)),
    "split": StageInputs(("split",), relations(("kept_trajectories", "trajectory_id"), KEPT_TURNS)),
    # `validation`: each training stage scores its models on the validation pool before and after.
    "cpt": StageInputs(("cpt", "model", "score", "validation"), _cpt_inputs),
    "sft": StageInputs(("sft", "model", "answers", "validation"), _sft_inputs),
    "rl": StageInputs(("rl", "model", "answers", "validation"), _rl_inputs),
    "evaluate": StageInputs(("evaluate", "model"), _evaluate_inputs),
    "fidelity": StageInputs(("fidelity", "model"), _fidelity_inputs),
    # The card shows the settings of every stage of the lineage.
    "export": StageInputs(
        (
            "export",
            "ingest",
            "filter",
            "score",
            "split",
            "model",
            "answers",
            "validation",
            "cpt",
            "sft",
            "rl",
            "evaluate",
        ),
        _export_inputs,
    ),
}


def package_version() -> str:
    try:
        return version("simulacra")
    except PackageNotFoundError:
        return "unknown"


def _module_file(module: str) -> Path | None:
    base = PROJECT_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(file: Path, module: str) -> set[str]:
    """Project modules a file imports, anywhere in it (imports inside functions count)."""
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            # `from pipeline import formats` imports a module; `from pipeline.x import name` may not.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in PROJECT_PACKAGES and _module_file(name)}


def import_closure(stage: str) -> dict[str, Path]:
    """Project modules `stages.<stage>` imports, directly or through others, with their files."""
    seen: dict[str, Path] = {}
    pending = [f"stages.{stage}"]
    while pending:
        module = pending.pop()
        file = _module_file(module)
        if module in seen or file is None:
            continue
        seen[module] = file
        pending.extend(_imported_modules(file, module) - seen.keys())
    if f"stages.{stage}" not in seen:
        raise ValueError(f"stage {stage!r} has no module stages/{stage}.py")
    return seen


@cache
def code_version(stage: str) -> str:
    """Package version + digest of the sources of the stage's import closure."""
    digest = hashlib.sha256()
    for module, file in sorted(import_closure(stage).items()):
        digest.update(module.encode() + b"\0" + file.read_bytes() + b"\0")
    return f"{package_version()}+{digest.hexdigest()[:12]}"


def fingerprint_inputs(config: SimulacraConfig, store: Store, stage: str) -> dict[str, Any]:
    """Everything the fingerprint hashes, readable (it is recorded with the run)."""
    if stage not in STAGE_INPUTS:
        raise ValueError(f"stage {stage!r} declares no inputs in pipeline/orchestration/fingerprint.py STAGE_INPUTS")
    inputs = STAGE_INPUTS[stage]
    return {
        "stage": stage,
        "config": {name: config.section_hash(name) for name in inputs.sections},
        "inputs": inputs.probe(config, store),
        "code": code_version(stage),
    }


def stage_fingerprint(config: SimulacraConfig, store: Store, stage: str) -> str:
    payload = json.dumps(fingerprint_inputs(config, store, stage), sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]
