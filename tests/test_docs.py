"""What the README and the documentation site show exists (issue 30).

- Every `simulacra` command in a ```bash block (README.md, docs/, deploy/README.md, which docs/deploying.md
  includes) is a command of the real CLI, with options it has; every `--set a.b=...` path is a field of
  `SimulacraConfig`; every `make X` is a target of the Makefile. Blocks marked `text` are records of what
  was run on a date (docs/performance.md) and are not checked.
- The generated configuration reference names every field of the typed config.
- Each sample record on docs/formats.md is detected as, and parsed by, the adapter its heading names.

`mkdocs build --strict` (`make docs`, run by `make test` first) checks the links, anchors and navigation.
"""

import importlib.util
import re
import shlex
import typing
from pathlib import Path

import pytest
import typer.main

from pipeline.cli import app
from pipeline.config import SimulacraConfig
from pipeline.formats import adapter, detect
from pipeline.formats.base import Malformed, iter_documents

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "deploy" / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")


def fenced_blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(line number of the block's first line, its text) for each fenced block of `language`."""
    blocks, current, start, indent, fence = [], None, 0, "", ""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        opened = FENCE.match(line)
        if current is None:
            if opened:
                indent, fence = opened.group(1), opened.group(2)
                current, start = ([] if opened.group(3) == language else None), number + 1
                if current is None:  # another language: skip to its closing fence
                    current = False
            continue
        if line.strip() == fence or (line.strip().startswith(fence) and not line.strip().strip("`~")):
            if current is not False:
                blocks.append((start, "\n".join(current)))
            current = None
            continue
        if current is not False:
            current.append(line[len(indent) :] if line.startswith(indent) else line)
    return blocks


def commands_of(block: str) -> list[list[str]]:
    """Each command of a shell block as its words: continuation lines joined, comments dropped, split at
    line ends (outside quotes), `&&`, `||`, `;`, `|` and `&`; a redirection and its target dropped. Usage
    notation (`[--format NAME]`, `PATH...`) loses its brackets and dots."""
    commands, pending = [], ""
    for line in block.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        try:
            tokens = list(_lexer(pending))
        except ValueError:  # a quote that closes on a later line
            continue
        pending = ""
        words, redirected = [], False
        for token in tokens:
            if set(token) <= set("&|;()<>"):
                if "<" in token or ">" in token:
                    redirected = True
                    continue
                commands.append(words)
                words = []
            elif redirected:
                redirected = False
            else:
                words.append(token.strip("[]").removesuffix("..."))
        commands.append(words)
    return [command for command in commands if command]


def _lexer(text: str) -> shlex.shlex:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return lexer


def shown_commands() -> list[tuple[str, list[str]]]:
    """(where, words) of every command in a bash block of the pages."""
    found = []
    for page in PAGES:
        for line, block in fenced_blocks(page, "bash"):
            for words in commands_of(block):
                found.append((f"{page.relative_to(REPO)}:{line}", words))
    return found


CLI = typer.main.get_command(app)


def option_names(command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)} | {"--help"}


def check_simulacra(words: list[str]) -> list[str]:
    """Problems with one `simulacra ...` command line (words from after `simulacra`)."""
    global_options = {"--config": True, "-c": True, "--set": True, "--help": False}
    position = 0
    while position < len(words) and words[position].startswith("-"):
        name = words[position].split("=", 1)[0]
        if name not in global_options:
            return [f"`simulacra {name}`: no such option before the command"]
        position += 2 if global_options[name] and "=" not in words[position] else 1
    if position == len(words):
        return []
    command, name = CLI, []
    while hasattr(command, "list_commands") and position < len(words):
        sub = command.get_command(None, words[position])
        if sub is None:
            return [f"`simulacra {' '.join([*name, words[position]])}`: no such command"]
        name.append(words[position])
        command, position = sub, position + 1
    problems = []
    known = option_names(command)
    for word in words[position:]:
        if word == "--":  # what follows goes to another program (`serve --engine vllm -- ...`)
            break
        if word.startswith("--") and word.split("=", 1)[0] not in known:
            problems.append(f"`simulacra {' '.join(name)}` has no option {word.split('=', 1)[0]}")
    return problems


def config_path_problem(path: str) -> str | None:
    """None when `a.b.c` names a field of SimulacraConfig (a list or mapping field may end it)."""
    from pydantic import BaseModel

    model: typing.Any = SimulacraConfig
    parts = path.split(".")
    for index, part in enumerate(parts):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None if model is dict else f"--set {path}: {'.'.join(parts[:index])} has no fields"
        field = model.model_fields.get(part)
        if field is None:
            return f"--set {path}: no field `{part}` in `{'.'.join(parts[:index]) or 'the configuration'}`"
        model = _field_model(field.annotation)
    return None


def _field_model(annotation):
    """The model a field holds, `dict` for a mapping, or None for a plain value."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is dict:
        return dict
    for argument in typing.get_args(annotation):
        if typing.get_origin(annotation) is list:
            return None  # a list is set whole: `--set sft.generators=[...]`
        found = _field_model(argument)
        if found is not None:
            return found
    return None


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {match.group(1) for match in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.MULTILINE)}


def problems_of(words: list[str]) -> list[str]:
    problems = []
    for index, word in enumerate(words):
        if word == "--set" and index + 1 < len(words) or word.startswith("--set="):
            value = words[index + 1] if word == "--set" else word.removeprefix("--set=")
            problem = config_path_problem(value.split("=", 1)[0].strip())
            if problem:
                problems.append(problem)
    program = Path(words[0]).name
    if program == "simulacra":
        problems += check_simulacra(words[1:])
    elif program == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        problems += [
            f"`make {target}`: no such target in the Makefile" for target in targets if target not in makefile_targets()
        ]
    return problems


def test_every_command_shown_exists():
    shown = shown_commands()
    simulacra_lines = [words for _, words in shown if Path(words[0]).name == "simulacra"]
    assert len(simulacra_lines) >= 40, "the parser found too few `simulacra` commands: is it still reading the blocks?"
    assert any(Path(words[0]).name == "make" for _, words in shown)
    problems = [f"{where}: {problem}" for where, words in shown for problem in problems_of(words)]
    assert problems == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("simulacra evaluate --data a.jsonl b.jsonl", []),
        ("simulacra --config x.yaml --set cpt.max_steps=2 cpt", []),
        ("simulacra server start --gpu-slots 8 && simulacra server status", []),
        ("simulacra ingest PATH... [--format NAME] [--rescan]", []),
        ("simulacra serve DIR --engine vllm -- --tensor-parallel-size 2", []),
        ("simulacra evaluate --dataset a.jsonl", ["`simulacra evaluate` has no option --dataset"]),
        ("simulacra trian", ["`simulacra trian`: no such command"]),
        ("simulacra server restart", ["`simulacra server restart`: no such command"]),
        ("simulacra --set cpt.max_step=5 cpt", ["--set cpt.max_step=5: no field `max_step` in `cpt`"]),
        ("python bench/learning.py --set score.keep_ratios.echo=0.9 --set 'sft.generators=[{kind: retrieval}]'", []),
        ("python bench/learning.py --set cpt.max_steps.x=1", ["--set cpt.max_steps.x=1: cpt.max_steps has no fields"]),
        ("make demo TORCH_SPEC=torch", []),
        ("make tests", ["`make tests`: no such target in the Makefile"]),
        ("simulacra ingest runs/ > log.txt 2>&1 &", []),
    ],
)
def test_the_checker(line, expected):
    """The checker itself, on lines that must pass and lines that must not."""
    assert [
        p.split(": ", 1)[-1] if p.startswith("--set") else p for words in commands_of(line) for p in problems_of(words)
    ] == [e.split(": ", 1)[-1] if e.startswith("--set") else e for e in expected]


def reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "docs" / "_hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_names_every_field():
    reference = reference_module()
    page = reference.configuration_page()
    shared = reference.shared_models(SimulacraConfig)
    under_shared = [path + "." for paths in shared.values() for path in paths]
    paths = list(reference.field_paths())
    assert len(paths) > 100
    missing = [
        path
        for path in paths
        if not any(path.startswith(prefix) for prefix in under_shared) and f"`{path}`" not in page
    ]
    for model in shared:
        section = page.split(f"### {model.__name__}\n", 1)[1].split("\n### ", 1)[0]
        missing += [f"{model.__name__}.{name}" for name in model.model_fields if f"| `{name}` |" not in section]
    assert missing == []


def formats_samples() -> list[tuple[str, str, str]]:
    """(adapter, file name, text) of each sample on docs/formats.md."""
    text = (REPO / "docs" / "formats.md").read_text()
    found = []
    for section in text.split("\n### `")[1:]:
        name = section.split("`", 1)[0]
        block = re.search(r'```\w+ title="([^"]+)"\n(.*?)\n```', section, re.DOTALL)
        found.append((name, block.group(1), block.group(2) + "\n"))
    return found


def test_there_is_a_sample_for_every_adapter():
    from pipeline.formats import ADAPTER_MODULES

    assert sorted(name for name, _, _ in formats_samples()) == sorted(ADAPTER_MODULES)


@pytest.mark.parametrize(("name", "file_name", "text"), formats_samples(), ids=[s[0] for s in formats_samples()])
def test_each_sample_record_is_read_by_its_adapter(tmp_path, name, file_name, text):
    from pipeline.config.ingest import SourceConfig

    path = tmp_path / file_name
    path.write_text(text)
    options = {}
    if name == "generic-jsonl":  # the mapping the page's config block gives
        config = re.search(r"field_mapping: (\{.*?\})", (REPO / "docs" / "formats.md").read_text(), re.DOTALL).group(1)
        import yaml

        source = SourceConfig(name="my-runs", path=str(path), format=name, field_mapping=yaml.safe_load(config))
        options = {"mapping": source.field_mapping}
    (document,) = list(iter_documents(path))[:1]
    assert not isinstance(document, Malformed), document
    detected = detect(document.content)
    assert (detected.name if detected else None) == (None if name == "generic-jsonl" else name)
    chosen = adapter(name, **options)
    trajectories = [chosen.parse(record.content, None) for record in chosen.records(document)]
    assert trajectories and all(trajectory.turns for trajectory in trajectories)
