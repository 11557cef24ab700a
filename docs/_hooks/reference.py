"""MkDocs hook: the reference pages, generated from the code at every build, so they cannot drift.

- `reference/configuration.md`: every field of `SimulacraConfig` (pipeline/config/), with its type,
  default and description, section by section. A model used in one place is listed under its path
  (`score.keep_ratios`); one embedded in several (`EndpointConfig`: `sft.judge.endpoint`,
  `evaluate.predictor`, ...) once, under its class name, linked from each place.
- `reference/cli.md`: every `simulacra` command, its arguments and options, from the Typer app
  (pipeline/cli.py).

Neither page is a file in docs/: `on_files` adds them to the build (mkdocs >= 1.6 `File.generated`).
`tests/test_docs.py` loads this module to check the configuration page names every field.
"""

import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONFIG_PAGE = "reference/configuration.md"
CLI_PAGE = "reference/cli.md"
# A default longer than this would stretch its table column; it is printed as YAML below the table.
INLINE_DEFAULT_CHARS = 48


# -- MkDocs events -----------------------------------------------------------------------------------
def on_files(files, config):
    from mkdocs.structure.files import File

    files.append(File.generated(config, CONFIG_PAGE, content=configuration_page()))
    files.append(File.generated(config, CLI_PAGE, content=cli_page()))
    return files


# -- Markdown helpers ------------------------------------------------------------------------------
def escape(text: str) -> str:
    """Text for a table cell: `<workspace>` would be an HTML tag, `*` emphasis, `|` a new cell; code
    spans (between backticks) are left as written, where Python-Markdown reads all three literally."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(
        part
        if part.startswith("`") and part.endswith("`") and len(part) > 1
        else part.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace("*", r"\*")
        .replace("|", "&#124;")
        .replace("_", r"\_")
        for part in parts
    )


def code(text: str) -> str:
    """A code span that holds backticks when the text does."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def anchor(title: str) -> str:
    """The id MkDocs' toc extension gives a heading of plain text."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


# -- configuration ---------------------------------------------------------------------------------
def configuration_page() -> str:
    from pipeline.config import SimulacraConfig

    shared = shared_models(SimulacraConfig)
    lines = [
        "# Configuration reference",
        "",
        "Generated from the typed configuration (`pipeline/config/`, `SimulacraConfig`) when the site is built: "
        "every field, its type, its default and its description. One YAML file sets any of them, one section "
        "per stage; `--set section.field=value` overrides one on the command line; "
        "`simulacra config --defaults` prints the same defaults as commented YAML, and `simulacra config` the "
        "effective configuration. A misspelt key or a wrong value stops the command before any work, naming "
        "the file and the field.",
        "",
        "| section | what it configures |",
        "|---|---|",
    ]
    for name, field in SimulacraConfig.model_fields.items():
        lines.append(f"| [`{name}`](#{anchor(name)}) | {escape(field.description or '')} |")
    lines.append("")
    for name, field in SimulacraConfig.model_fields.items():
        lines += model_section(name, model_of(field.annotation), shared, level=2)
    if shared:
        lines += ["## Shared types", "", "Models embedded in more than one place; each place links here.", ""]
        for model, paths in shared.items():
            lines += model_section(
                model.__name__, model, shared, level=3, used_at=", ".join(code(path) for path in paths)
            )
    return "\n".join(lines) + "\n"


def model_section(path: str, model, shared: dict, level: int, used_at: str | None = None) -> list[str]:
    """A heading, the model's docstring, a table of its fields, long defaults, then the sections of
    the models it embeds that are used only there."""
    from pydantic import BaseModel

    lines = ["#" * level + " " + path, ""]
    if used_at:
        lines += [f"Used at: {used_at}.", ""]
    doc = model.__doc__ or ""
    if doc and doc != BaseModel.__doc__ and not doc.startswith(model.__name__ + "("):
        lines += [escape(doc.strip().split("\n\n")[0]), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    long_defaults, nested = [], []
    prefix = "" if used_at else path + "."
    for name, field in model.model_fields.items():
        dotted = prefix + name
        inner = model_of(field.annotation)
        default = default_text(field)
        if inner is not None and inner not in shared:
            nested.append((dotted + ("[]" if is_list(field.annotation) else ""), inner))
        if default is not None and len(default) > INLINE_DEFAULT_CHARS:
            long_defaults.append((dotted, field))
            shown = f"[below](#{anchor(dotted + ' default')})"
        else:
            shown = "required" if default is None else code(default)
        lines.append(
            f"| {code(dotted)} | {type_text(field.annotation, shared)} | {shown} | {escape(field.description or '')} |"
        )
    lines.append("")
    for dotted, field in long_defaults:
        lines += [
            f"Default of `{dotted}`:",
            f"{{: #{anchor(dotted + ' default')} }}",
            "",
            "```yaml",
            yaml_default(field).rstrip(),
            "```",
            "",
        ]
    for dotted, inner in nested:
        lines += model_section(dotted, inner, shared, level + 1)
    return lines


def model_of(annotation):
    """The pydantic model a field holds (alone, in a list, or optional), or None."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = model_of(argument)
        if found is not None:
            return found
    return None


def is_list(annotation) -> bool:
    """`list[X]`, alone or optional: its items are documented under `name[]`."""
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(is_list(argument) for argument in typing.get_args(annotation))
    return False


def shared_models(root) -> dict:
    """Models embedded at two or more paths, each with its paths, in the order met."""
    seen: dict = {}
    for path, model in embedded_models(root, ""):
        seen.setdefault(model, []).append(path)
    return {model: paths for model, paths in seen.items() if len(paths) > 1}


def embedded_models(model, prefix: str) -> Iterator[tuple[str, Any]]:
    for name, field in model.model_fields.items():
        inner = model_of(field.annotation)
        if inner is not None:
            path = prefix + name + ("[]" if is_list(field.annotation) else "")
            if prefix:  # the top-level sections are headed by their path, never shared
                yield path, inner
            yield from embedded_models(inner, path + ".")


def type_text(annotation, shared: dict) -> str:
    """`int | None`, `list[str]`, `"a" | "b"`, a link to a shared model."""
    text = type_name(annotation)
    inner = model_of(annotation)
    if inner is not None and inner in shared:
        return f"[{code(text)}](#{anchor(inner.__name__)})"
    return code(text)


def type_name(annotation) -> str:
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is typing.Literal:
        return " | ".join(json.dumps(value) for value in arguments)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(argument) for argument in arguments)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(type_name(a) for a in arguments)}]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation.__name__
    if annotation is Path or (isinstance(annotation, type) and issubclass(annotation, Path)):
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def default_value(field) -> Any:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        return field.default_factory()
    return None if field.default is PydanticUndefined else field.default


def plain(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def default_text(field) -> str | None:
    """The default as YAML flow text; None for a required field. A section's default is its fields'."""
    from pydantic import BaseModel

    if field.is_required():
        return None
    value = default_value(field)
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    return json.dumps(plain(value), ensure_ascii=False) if value is not None else "null"


def yaml_default(field) -> str:
    import yaml

    return yaml.safe_dump(plain(default_value(field)), sort_keys=False, allow_unicode=True, width=1000)


def field_paths(model=None, prefix: str = "") -> Iterator[str]:
    """Every field's dotted path (list items as `name[]`): what the page must name, for the tests."""
    if model is None:
        from pipeline.config import SimulacraConfig

        model = SimulacraConfig
    for name, field in model.model_fields.items():
        path = prefix + name
        yield path
        inner = model_of(field.annotation)
        if inner is not None:
            yield from field_paths(inner, path + ("[]" if is_list(field.annotation) else "") + ".")


# -- command line ----------------------------------------------------------------------------------
def cli_page() -> str:
    import typer.main

    from pipeline.cli import app

    group = typer.main.get_command(app)
    lines = [
        "# Command-line reference",
        "",
        "Generated from the `simulacra` command (`pipeline/cli.py`) when the site is built. The options of "
        "`simulacra` itself come before the command name and apply to every command:",
        "",
        *parameter_table(group.params),
        "A problem you can fix (a stage run before its inputs exist, a missing file, a store another process "
        "holds) prints one line naming the fix and exits with status 2; ctrl-C prints one line and exits 130, "
        "and rerunning the command resumes; anything else is a bug and prints its traceback.",
        "",
    ]
    for name, command in commands(group):
        lines += [
            f"## simulacra {name}",
            "",
            escape(command.help or ""),
            "",
            "```",
            f"simulacra [--config FILE] [--set KEY=VALUE]... {name} {usage(command)}".rstrip(),
            "```",
            "",
        ]
        lines += parameter_table(command.params)
    return "\n".join(lines) + "\n"


def commands(group, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, command) for every command, a sub-group's as `server start`. (Typer 0.29 carries its own
    click, `typer._click`: groups are told by their `list_commands`, parameters by `param_type_name`.)"""
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if hasattr(command, "list_commands"):
            yield from commands(command, prefix + name + " ")
        else:
            yield prefix + name, command


def usage(command) -> str:
    words = []
    for param in command.params:
        if param.param_type_name == "argument":
            word = param.name.upper() + ("..." if param.nargs == -1 else "")
            words.append(word if param.required else f"[{word}]")
    if any(param.param_type_name == "option" for param in command.params):
        words.insert(0, "[OPTIONS]")
    return " ".join(words)


def parameter_table(params) -> list[str]:
    rows = ["| argument or option | value | default | description |", "|---|---|---|---|"]
    for param in params:
        if param.name == "help" or getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            names = param.name.upper() + ("..." if param.nargs == -1 else "")
        else:
            names = ", ".join([*param.opts, *param.secondary_opts])
        if getattr(param, "is_flag", False):
            value = "flag"
        else:
            value = code(param.bare_type()) + (", repeatable" if getattr(param, "multiple", False) else "")
        default = param.default
        shown = (
            "required"
            if param.required
            else ""
            if default in (None, (), [])
            else code(
                str(default.name if hasattr(default, "name") and not isinstance(default, (str, Path)) else default)
            )
        )
        rows.append(f"| {code(names)} | {value} | {shown} | {escape(getattr(param, 'help', '') or '')} |")
    return [*rows, ""] if len(rows) > 2 else []
