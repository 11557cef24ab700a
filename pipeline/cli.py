"""The `simulacra` command line.

Heavy libraries (torch, transformers, prefect) are imported inside the commands that use them,
so `simulacra --help` and the data commands start fast. Commands call the stages directly; `run`
goes through the Prefect flow.

A problem the user can fix (pipeline/errors.py: a stage run before its inputs exist, a missing
file, a busy store) is printed as one line naming the fix, with exit status 2, whichever command
raised it; any other exception is a bug and keeps its traceback.
"""

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from pipeline.config import ConfigError, SimulacraConfig, load_config, parse_override
from pipeline.errors import (
    UserFixableError,
    full_disk,
    interrupted,
    interrupts_received,
    stopped_by,
    watch_for_interrupts,
)
from pipeline.llm.batching import DRAFT_TOKENS  # the standard library only at import

console = Console(stderr=True)


def table_console() -> Console:
    """Where a command prints its tables. Not a terminal (a pipe, a file, a CI log): 160 columns, where rich's
    default of 80 cut `simulacra stats`'s headers and sources to "sou…", "turn_…", "termi…"."""
    return Console(width=None if sys.stdout.isatty() else 160)


# Stages that load the base model or a checkpoint trained from it: `simulacra run` of any of them converts a GGUF
# base in the background while the flow starts (pipeline/training/gguf_base.py: start_background_conversion).
MODEL_STAGES = {"cpt", "sft", "rl", "evaluate", "fidelity"}


class Commands(TyperGroup):
    """The command group: runs the chosen command, and turns a UserFixableError into one line on
    stderr and exit status 2, and ctrl-C into one line and status 130 (SIGTERM 143), even one a library dropped.
    Text, not markup: messages hold brackets (`file[3]`)."""

    def invoke(self, ctx):
        watch_for_interrupts()
        before = interrupts_received()
        try:
            result = super().invoke(ctx)
        except BaseException as exc:
            if interrupted(exc) or interrupts_received() > before:
                self._stop_interrupted(ctx)
            # A full disk is the user's to fix too; what was committed before it stays, so the same command resumes.
            full = None if isinstance(exc, UserFixableError) else full_disk(exc, _workspace_root())
            if full is not None:
                exc = UserFixableError(f"{full}, then rerun the same command to resume")
            if not isinstance(exc, UserFixableError):
                raise
            console.print(Text.assemble((f"{ctx.invoked_subcommand}: ", "red"), str(exc)), soft_wrap=True)
            raise typer.Exit(2) from None
        if interrupts_received() > before:  # its KeyboardInterrupt was dropped on the way (pipeline/errors.py)
            self._stop_interrupted(ctx)
        return result

    @staticmethod
    def _stop_interrupted(ctx) -> None:
        # Every write is a transaction (pipeline/store/database.py): what was committed stays, the
        # rest rolled back, and each stage resumes from what it committed.
        line, status = stopped_by(ctx.invoked_subcommand)
        console.print(Text.assemble((f"{ctx.invoked_subcommand}: ", "red"), line), soft_wrap=True)
        raise typer.Exit(status) from None


app = typer.Typer(
    name="simulacra",
    cls=Commands,
    help="Train language world models of agent environments: ingest, filter, score, split, train.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
_state: dict[str, Any] = {}

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="YAML config; defaults apply to anything it leaves out.")
]
SetOption = Annotated[
    list[str] | None, typer.Option("--set", help="Override one field, e.g. --set cpt.max_steps=5 (repeatable).")
]


@app.callback()
def main(config: ConfigOption = None, set_: SetOption = None) -> None:
    _state.clear()
    _state["config_path"] = config
    _state["overrides"] = set_ or []


def _config() -> SimulacraConfig:
    if "config" not in _state:
        try:
            overrides = [parse_override(text) for text in _state.get("overrides", [])]
            _state["config"] = load_config(_state.get("config_path"), overrides)
        except ConfigError as exc:
            # soft_wrap: a field's line stays one line whatever the terminal's width (a log greps it whole).
            console.print(f"[red]config error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    return _state["config"]


def _workspace_root() -> Path:
    """Where free space is measured when a write failed on a full disk: the workspace of the config the command
    parsed, else the folder it runs in."""
    config = _state.get("config")
    return config.workspace.root if config is not None else Path.cwd()


def _store(read_only: bool = False, existing: bool = True):
    """The workspace's store. Only ingest, and a command given files of its own (`--data`, a checkpoint to export),
    starts one: the others read what earlier stages stored, and in a workspace without a store (a mistyped
    `workspace.path`, the default one relative to another directory) "run `simulacra split` first" sent the user to
    the wrong fix and left an empty store behind."""
    from pipeline.store.database import open_store

    return open_store(_config(), read_only=read_only, existing=existing)


def _known_domain(domain: str) -> None:
    """`--domain`, one of the store's domains: else one line naming them (pydantic's was four and a web address)."""
    from pipeline.store.schema import DOMAINS

    if domain not in DOMAINS:
        raise UserFixableError(f"unknown domain `{domain}`: --domain is one of {', '.join(DOMAINS)}")


def _report(result) -> None:
    console.print(f"[bold]{result.stage}[/bold]: {result.summary}", highlight=False, soft_wrap=True)


@app.command()
def ingest(
    paths: Annotated[list[str] | None, typer.Argument(help="Files, folders, globs or hf://name[:split].")] = None,
    format_name: Annotated[
        str | None, typer.Option("--format", help="Force an adapter (see `simulacra formats`).")
    ] = None,
    source: Annotated[str | None, typer.Option(help="Source name to record (default: the path's name).")] = None,
    domain: Annotated[str | None, typer.Option(help="Domain for every trajectory read (default: inferred).")] = None,
    rescan: Annotated[bool, typer.Option(help="Re-read files already ingested with the same content.")] = False,
) -> None:
    """Read trajectories into the store; malformed records go to quarantine with their reason."""
    from stages import ingest as stage

    if domain is not None:
        _known_domain(domain)
    config = _config()
    if not paths and not config.ingest.sources:
        console.print("nothing to ingest: give PATHs or list `ingest.sources` in the config", soft_wrap=True)
        raise typer.Exit(2)
    with _store(existing=False) as store:
        try:
            result = stage.run(
                config, store, paths=paths, format_name=format_name, source_name=source, domain=domain, rescan=rescan
            )
        except (FileNotFoundError, ValueError) as exc:
            console.print(f"[red]ingest:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    _report(result)
    not_read = result.metrics["paths_not_read"]
    if not_read:  # what was read is kept; the rest needs the user (permissions, the network), then a rerun adds it
        hub = sum(entry["path"].startswith("hf://") for entry in not_read)
        cut = sum(entry["reason"].startswith(stage.CUT_SHORT) for entry in not_read)
        fixes = ["make the files readable"] if hub + cut < len(not_read) else []
        if cut:  # the file is there and readable: it is incomplete
            fixes.append("copy or download again the files cut short")
        if hub:  # "make them readable" said nothing to do of a dataset the Hub could not be reached for
            fixes.append(
                "reach the Hugging Face Hub (network; HF_TOKEN for a gated dataset) or download the dataset to a folder and ingest that"
            )
        console.print(
            f"[red]ingest:[/red] {len(not_read)} path(s) could not be read: {'; '.join(fixes)}; then rerun",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)


@app.command("filter")
def filter_trajectories() -> None:
    """Apply the trajectory- and turn-level rules; every drop is recorded with its rule and reason."""
    from stages import filter as stage

    with _store() as store:
        _report(stage.run(_config(), store))


@app.command()
def score() -> None:
    """Score every kept turn: overlap, novelty, Jaccard, length ratio, category and keep ratio."""
    from stages import score as stage

    with _store() as store:
        _report(stage.run(_config(), store))


@app.command()
def split() -> None:
    """Assign every kept trajectory, with the rest of its group (task), to one pool (cpt, sft, rl, eval); pick targets."""
    from stages import split as stage

    with _store() as store:
        _report(stage.run(_config(), store))


@app.command("init-model")
def init_model(
    text: Annotated[list[Path], typer.Argument(help="Text files or folders to train the tokenizer on.")],
    out: Annotated[Path | None, typer.Option(help="Output folder (default: <workspace>/models/tiny).")] = None,
) -> None:
    """Build the tiny offline model (tokenizer + random Qwen3/Llama) from local text: no model hub."""
    from pipeline.formats.file_encoding import not_utf8_text
    from pipeline.formats.sources import visible_files
    from pipeline.training.models import tiny_model_dir
    from pipeline.training.tiny_model import build_tiny_model

    if missing := [str(p) for p in text if not p.exists()]:
        console.print(f"init-model: no such file or folder: {', '.join(missing)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    found = sorted(f for p in text for f in ([p] if p.is_file() else visible_files(p)) if f.is_file())
    # A folder of text often holds an image or an archive; read as text, its bytes would become tokens.
    other = [f for f in found if not_utf8_text(f)]
    files = sorted(set(found) - set(other))
    passed_over = f" ({len(other)} files not UTF-8 text passed over, e.g. {other[0]})" if other else ""
    if not files:
        where = ", ".join(map(str, text))
        console.print(f"init-model: no text files under {where}{passed_over}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    config = _config()
    path = build_tiny_model(config.model.tiny, files, out or tiny_model_dir(config))
    console.print(
        f"tiny model written to {path} (tokenizer trained on {len(files)} files){passed_over}",
        highlight=False,
        soft_wrap=True,
    )


@app.command()
def cpt() -> None:
    """Continual pretraining on the cpt pool with keep-ratio loss masks and the world-knowledge mix."""
    from stages import cpt as stage

    with _store() as store:
        _report(stage.run(_config(), store))


@app.command()
def sft() -> None:
    """Rejection-sampled SFT: judged thinking candidates for the sft pool's queries, then training on the winners."""
    from stages import sft as stage

    with _store() as store:
        _report(stage.run(_config(), store))


@app.command()
def rl() -> None:
    """GSPO reinforcement learning on the rl pool's prompts: rubric (or semantic) and rule rewards, 9:1."""
    from stages import rl as stage

    with _store() as store:
        result = stage.run(_config(), store)
    _report(result)


@app.command("export")
def export_checkpoint() -> None:
    """Write the world-model checkpoint (weights, tokenizer, chat template, model card), register it, copy it."""
    from pipeline.serving.export_source import NothingToExport
    from stages import export as stage

    with _store(existing=_config().export.checkpoint is None) as store:
        try:
            result = stage.run(_config(), store)
        except (NothingToExport, ValueError) as exc:
            console.print(f"[red]export:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    _report(result)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(
    ctx: typer.Context,
    checkpoint: Annotated[
        Path, typer.Argument(help="An exported folder (`simulacra export` prints where it wrote it).")
    ],
    host: Annotated[
        str, typer.Option(help="Interface to listen on; 0.0.0.0 exposes it beyond this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 takes a free one, printed when serving starts.")] = 8000,
    engine: Annotated[
        str,
        typer.Option(
            help="embedded (this project's server: CPU or one GPU) or vllm (GPUs; the "
            "gpu extra). Arguments after `--` go to vLLM."
        ),
    ] = "embedded",
    device: Annotated[
        str, typer.Option(help="Embedded engine: auto (a GPU when there is one), cpu, cuda, cuda:1 ...")
    ] = "auto",
    max_tokens: Annotated[int, typer.Option(min=1, help="Token budget of an answer whose request sets none.")] = 1024,
    max_batch: Annotated[
        int,
        typer.Option(min=1, help="Embedded engine: most sequences decoded together (each choice of a request is one)."),
    ] = 32,
    max_body_mb: Annotated[
        float, typer.Option(min=0.001, help="Largest request body in MiB, refused (413) before it is read.")
    ] = 4.0,
    draft_tokens: Annotated[
        int,
        typer.Option(
            min=0,
            help="Embedded engine: tokens a greedy request may guess ahead a step by prompt lookup, kept only where "
            "the model agrees (the same answers, fewer steps); 0 decodes one token a step.",
        ),
    ] = DRAFT_TOKENS,
    kv_cache_gib: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            help="Embedded engine: the KV cache's budget in GiB; requests wait while the batch's rows times its widest "
            "(prompt and answer budget) would pass it. Default: a quarter of the memory on a CPU, none on a GPU.",
        ),
    ] = None,
) -> None:
    """Serve a world model as the environment: OpenAI-compatible /v1/chat/completions (streaming too),
    /v1/models, /health."""
    from pipeline.serving.export_folder import read_metadata

    read_metadata(checkpoint)  # not an export, or a damaged one: one line, before anything loads
    if engine == "vllm":
        from pipeline.serving.vllm_engine import run_vllm

        raise typer.Exit(run_vllm(checkpoint.resolve(), host, port, ctx.args))
    if engine != "embedded" or ctx.args:
        reason = f"unknown engine `{engine}`" if engine != "embedded" else f"unexpected arguments {' '.join(ctx.args)}"
        console.print(
            f"[red]serve:[/red] {reason}: --engine is embedded or vllm, and only vllm takes arguments after `--`",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    from pipeline.serving.server import serve as run_server

    run_server(
        checkpoint, host, port, device, max_tokens, max_batch, int(max_body_mb * (1 << 20)), draft_tokens, kv_cache_gib
    )


@app.command("openenv")
def openenv_serve(
    domain: Annotated[str, typer.Option(help="The domain the world model simulates: terminal, mcp, web, ...")],
    world_model: Annotated[
        str, typer.Option(help="The /v1 URL of the world model's endpoint (`simulacra serve` or vLLM).")
    ] = "http://127.0.0.1:8000/v1",
    episode: Annotated[
        Path | None,
        typer.Option(
            help="YAML mapping of the episode every reset starts unless it "
            "gives its own: task, action_space, initial_state, verifier, "
            "success_pattern, max_steps, ..."
        ),
    ] = None,
    host: Annotated[
        str, typer.Option(help="Interface to listen on; 0.0.0.0 exposes it beyond this machine.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port; 0 takes a free one, printed when serving starts.")] = 8001,
    model: Annotated[
        str | None, typer.Option(help="The served model's name; by default the endpoint's only one.")
    ] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="Most WebSocket sessions (episodes) at once.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, help="Token budget of each simulated observation.")] = 512,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature of the world model; episodes replay from their seed.")
    ] = 1.0,
    prompt_format: Annotated[
        str | None,
        typer.Option(
            help="For vLLM: the prompt format the export recorded (simulacra.json); `simulacra serve` says it itself."
        ),
    ] = None,
    max_history_chars: Annotated[
        int | None, typer.Option(help="For vLLM: the history budget the export recorded (simulacra.json).")
    ] = None,
) -> None:
    """Serve a world-model endpoint as an OpenEnv environment: HTTP and WebSocket, for OpenEnv's EnvClient."""
    _known_domain(domain)
    from pipeline.serving.episode import read_episode
    from pipeline.serving.listening import listening_socket
    from pipeline.serving.openenv_preflight import probe_world_model, require_openenv

    # Every refusal before OpenEnv's import, which takes seconds (pipeline/serving/openenv_preflight.py).
    default = read_episode(episode) if episode is not None else None
    sock = listening_socket(host, port)
    require_openenv()
    served = probe_world_model(
        world_model, domain, model=model, prompt_format=prompt_format, max_history_chars=max_history_chars
    )
    from pipeline.serving import openenv_env

    openenv_env.serve(
        served,
        domain,
        default,
        sock,
        host,
        max_sessions=max_sessions,
        max_tokens=max_tokens,
        temperature=temperature,
    )


class ListOptions(TyperCommand):
    """A command whose list options take every value up to the next option, as argparse's `nargs="+"`
    does: `evaluate --data a.jsonl b.jsonl` as well as `--data a.jsonl --data b.jsonl` (issue 30).
    Click gives an option one value a time; the values are spelled out as repeated options before it parses."""

    list_options = ("--data", "--checkpoint")

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, repeat_list_options(args, self.list_options))


def repeat_list_options(args: list[str], names: tuple[str, ...]) -> list[str]:
    """`--data a b --thinking` -> `--data a --data b --thinking`; `--` ends the options, as everywhere."""
    out: list[str] = []
    current = None  # the list option whose values are being read
    position = 0
    while position < len(args):
        arg = args[position]
        if arg == "--":
            return out + args[position:]
        if arg in names and position + 1 < len(args):  # `--data x`: x is its first value, as Click reads it
            current = arg
            out += [arg, args[position + 1]]
            position += 2
            continue
        if arg.startswith("-"):
            current = arg.split("=", 1)[0] if arg.split("=", 1)[0] in names else None  # `--data=x y`
            out.append(arg)
        else:
            out += [current, arg] if current else [arg]
        position += 1
    return out


@app.command(cls=ListOptions)
def evaluate(
    checkpoint: Annotated[
        list[str] | None,
        typer.Option(
            "--checkpoint",
            help="Model folders to evaluate (several after one --checkpoint, or it repeated); default: "
            "the base model and every stage's newest checkpoint.",
        ),
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help="Evaluate on these benchmark files or folders (AgentWorldBench rows, or any format ingest "
            "reads; several after one --data): their marked target turns as given, their own system prompts; "
            "nothing is ingested.",
        ),
    ] = None,
    thinking: Annotated[
        bool,
        typer.Option(
            "--thinking", help="Ask unregistered --checkpoint folders in the thinking format (SFT/RL checkpoints)."
        ),
    ] = False,
) -> None:
    """Score every checkpoint against the base and the retrieval baseline: judge (0-100) and judge-free metrics."""
    from stages import evaluate as stage

    config = _config()
    if data and config.evaluate.max_queries is not None and config.evaluate.benchmark.max_items_per_path is None:
        # A budget set and silently not applied: a check meant for 12 targets of tau-bench asked all 413.
        console.print(
            f"evaluate: evaluate.max_queries ({config.evaluate.max_queries}) limits the eval pool, not --data files, "
            "whose every target is scored; evaluate.benchmark.max_items_per_path limits those",
            highlight=False,
            soft_wrap=True,
        )
    with _store(existing=not data) as store:
        result = stage.run(config, store, checkpoints=checkpoint, data=data, thinking=thinking)
    _show_evaluation(result)


def _show_evaluation(result) -> None:
    """The evaluate stage's tables: scores, criteria, judge-free metrics, paired comparisons, correlations."""
    from pipeline.evaluation.report import judge_caption
    from pipeline.sft.judging import CRITERIA

    out = table_console()
    rows = result.tables["evaluate-table"]
    judge = result.metrics["judge"]
    # Every mean is printed with its 95% interval over targets, as lm-evaluation-harness prints a stderr (issue 28).
    _print_rows(
        out,
        rows,
        f"judge: {judge_caption(judge)}; scores (raw - 1) / 4 x 100, `score` sample-weighted, "
        f"`score_macro` the mean over domains, each with its 95% interval ({result.metrics['eval_set']})",
        ("model", "domain", "queries", "score", "score_macro", "score_unseen", "seen", "judged", "empty", "parse_rate"),
    )
    if any(row[name] is not None for row in rows for name in CRITERIA):  # the similarity judge scores no criteria
        _print_rows(out, rows, "the judge's criteria (0-100)", ("model", "domain", *CRITERIA))
    _print_rows(
        out,
        rows,
        "judge-free metrics (observation_ce token-weighted, its interval of the mean per-target CE)",
        (
            "model",
            "domain",
            "observation_ce",
            "perplexity",
            "ce_rows",
            "semantic_match",
            "rouge_l",
            "exact_match",
            "exact",
            "line_agreement",
            "json_valid",
        ),
    )
    overall = [row for row in result.tables["evaluate-comparisons"] if row["domain"] == "all"]
    if overall:
        _print_rows(
            out,
            overall,
            "paired comparisons, all domains (model - compared_with on the targets both scored, 95% "
            "interval; observation_ce lower is better; per domain in report.json)",
            ("model", "compared_with", "relation", "measure", "change", "verdict", "targets"),
        )
    correlated = result.tables["evaluate-correlations"]
    _print_rows(
        out,
        correlated,
        "Spearman rho, judge score vs each judge-free metric (judged rows: parsed answers with a "
        "valid judgement, every model pooled)",
        tuple(correlated[0]),
    )
    _report(result)
    console.print(f"plot and report: {result.output_path}", highlight=False, soft_wrap=True)


@app.command(cls=ListOptions)
def fidelity(
    checkpoint: Annotated[
        list[str] | None,
        typer.Option(
            "--checkpoint",
            help="Model folders to measure (several after one --checkpoint, or it repeated; an exported folder "
            "is asked in its own format); default: the base model and every stage's newest checkpoint.",
        ),
    ] = None,
    data: Annotated[
        list[str] | None,
        typer.Option(
            "--data",
            help="Roll out the trajectories of these files or folders (any format ingest reads; several after one "
            "--data) instead of the eval pool's; nothing is ingested.",
        ),
    ] = None,
    thinking: Annotated[
        bool,
        typer.Option(
            "--thinking", help="Ask unregistered --checkpoint folders in the thinking format (SFT/RL checkpoints)."
        ),
    ] = False,
) -> None:
    """How far each simulator can be trusted: closed-loop rollouts against the real observations, and scripted
    policies ranked in the simulator as in the real environments."""
    from stages import fidelity as stage

    with _store(existing=not data) as store:
        result = stage.run(_config(), store, checkpoints=checkpoint, data=data, thinking=thinking)
    out = table_console()
    _print_rows(
        out,
        [row for row in result.tables["fidelity-divergence"] if row["domain"] == "all"],
        f"steps to the first divergence (a step scoring below {_config().fidelity.divergence_threshold:g}), "
        "Kaplan-Meier median over trajectories, all domains (per domain in report.json)",
        ("simulator", "mode", "trajectories", "diverged", "steps_to_first_divergence"),
    )
    _print_rows(
        out,
        [row for row in result.tables["fidelity-curves"] if row["domain"] == "all"],
        f"score (0-100) against step, all domains, mean [95% interval] (judge: {result.metrics['judge']})",
        ("simulator", "step", "mode", "trajectories", "score", "exact_match", "closed_minus_open"),
    )
    agreement = [row for row in result.tables["fidelity-agreement"] if row["environment"] == "all"]
    if agreement:
        _print_rows(
            out,
            agreement,
            "policy success rates [95% Wilson interval], all environments; simulated - real paired on the same "
            "tasks and seeds (per environment in report.json)",
            ("simulator", "policy", "episodes_real", "real", "episodes_simulated", "simulated", "simulated_minus_real"),
        )
        _print_rows(
            out,
            result.tables["fidelity-ranks"],
            "rank agreement: Kendall tau-b between the policies' simulated and real success rates",
            ("simulator", "environment", "policies", "kendall_tau_b", "why"),
        )
    _report(result)
    console.print(f"plots, tables and report: {result.output_path}", highlight=False, soft_wrap=True)


def _print_rows(out: Console, rows: list[dict[str, Any]], title: str, columns: tuple[str, ...]) -> None:
    """A table of rows; a value with its interval (`<column>_low`, `_high`) as `41.1 [35.2, 47.0]`."""
    from pipeline.evaluation.report import with_interval

    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(
            *(
                with_interval(row, c)
                or ("-" if row[c] is None else f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]))
                for c in columns
            )
        )
    out.print(table)


@app.command()
def formats() -> None:
    """List the ingestion format adapters, in detection order."""
    from pipeline import formats as registry

    table = Table("format", "default domain", "what it reads")
    for name in registry.ADAPTER_MODULES:
        adapter = registry.adapter(name) if name != "generic-jsonl" else None
        if adapter is None:
            table.add_row(name, "other", "Any JSONL, through `field_mapping` in the source's config (never detected).")
        else:
            table.add_row(name, adapter.default_domain, adapter.description)
    table_console().print(table)


@app.command()
def stats(as_json: Annotated[bool, typer.Option("--json", help="Print the numbers as JSON.")] = False) -> None:
    """What the store holds: counts per source, drops by rule, categories, pools, eval overlap with training."""
    from stages import stats as report

    with _store(read_only=True) as store:
        numbers = report.collect(store)
    if as_json:
        print(json.dumps(numbers, indent=2, default=str))
        return
    out = table_console()
    for name, rows in numbers.items():
        if not rows:
            continue
        table = Table(*rows[0].keys(), title=name)
        for row in rows:
            table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
        out.print(table)


@app.command("config")
def show_config(
    defaults: Annotated[
        bool, typer.Option("--defaults", help="Print the defaults with every field's description.")
    ] = False,
) -> None:
    """Validate and print the effective configuration (or the documented defaults)."""
    import yaml

    if defaults:
        print(_documented_defaults(SimulacraConfig()))
        return
    config = _config()
    print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))


def _documented_defaults(instance, indent: int = 0) -> str:
    """YAML of the defaults with each field's description as a comment above it."""
    import yaml
    from pydantic import BaseModel

    lines = []
    pad = "  " * indent
    for name, field in type(instance).model_fields.items():
        if field.description:
            lines.append(f"{pad}# {field.description}")
        value = getattr(instance, name)
        if isinstance(value, BaseModel):
            lines.append(f"{pad}{name}:")
            lines.append(_documented_defaults(value, indent + 1))
        else:
            dumped = yaml.safe_dump(
                {name: _plain(value)}, sort_keys=False, default_flow_style=False, width=1000
            ).rstrip()
            lines.extend(pad + line for line in dumped.splitlines())
    return "\n".join(lines)


def _plain(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


@app.command("run")
def run_pipeline(
    config: ConfigOption = None,
    set_: SetOption = None,
    stages: Annotated[
        str | None, typer.Option(help="Comma-separated stages, e.g. ingest,filter (default: orchestration.stages).")
    ] = None,
) -> None:
    """Run the stages as the `world-model-pipeline` Prefect flow, locally: no server, no API key.

    A stage whose fingerprint already completed is skipped; one that failed part-way resumes.
    """
    from pipeline.config.orchestration import STAGE_ORDER
    from pipeline.orchestration.prefect_env import check_prefect_database, configure

    if config is not None:
        _state["config_path"] = config
    _state["overrides"] = [*_state.get("overrides", []), *(set_ or [])]
    _state.pop("config", None)  # parsed again with this command's --config and --set
    chosen = [name.strip() for name in stages.split(",") if name.strip()] if stages else None
    unknown = sorted(set(chosen or []) - set(STAGE_ORDER))
    if unknown:
        console.print(
            f"[red]unknown stage(s)[/red] {', '.join(unknown)}; stages are {', '.join(STAGE_ORDER)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    check_prefect_database(_config().workspace.prefect_home)  # before Prefect's server tries it for minutes
    if chosen is None or set(chosen) & MODEL_STAGES:
        from pipeline.training.gguf_base import start_background_conversion

        workspace = _config().workspace
        start_background_conversion(_config().model.base, workspace.root, workspace.runs_dir / "gguf-conversion.log")
    configure(_config().workspace.prefect_home)
    from flows.dag import StageFailed
    from flows.world_model import world_model_pipeline
    from pipeline.orchestration.console_log import quiet_fixable_tracebacks
    from pipeline.orchestration.temporary_server import start_temporary_server

    quiet_fixable_tracebacks()  # a fixable failure is its one line on the terminal (the stored log keeps all)
    start_temporary_server()  # where Prefect would start one itself: apart from the terminal's ctrl-C

    path = _state.get("config_path")
    failure = None
    try:
        outcomes = world_model_pipeline(config_path=str(path or ""), stages=chosen or (), overrides=_state["overrides"])
    except StageFailed as exc:
        outcomes, failure = exc.outcomes, exc
    if outcomes:
        table = Table("stage", "status", "fingerprint", "summary")
        for outcome in outcomes:
            table.add_row(outcome.stage, outcome.status, outcome.fingerprint, outcome.summary)
        table_console().print(table)
    if failure is None and any(outcome.stage == "evaluate" for outcome in outcomes or ()):
        _show_run_evaluation()
    if failure is not None and failure.fixable:  # its message names what to do first; a rerun alone would fail again
        console.print(f"[red]{failure}[/red]", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if failure is not None:
        console.print(f"[red]{failure}[/red]; rerun the same command to resume", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


def _show_run_evaluation() -> None:
    """The run's evaluation tables, as `simulacra evaluate` shows them, from what the evaluate stage stored (its
    answers and judgements are reused, nothing is asked again): the demo ends with them. Not where the stage ran
    on the GPU pool, whose worker may keep what it stored out of this machine's reach."""
    from flows.dag import on_gpu_pool
    from stages import evaluate as stage

    config = _config()
    if on_gpu_pool(config, "evaluate"):
        console.print("the evaluation tables: `simulacra evaluate` where the evaluate stage's results are")
        return
    with _store() as store:
        _show_evaluation(stage.run(config, store))


server_app = typer.Typer(
    help="A local Prefect server (UI) and process worker for this workspace.", no_args_is_help=True
)
app.add_typer(server_app, name="server")


ProjectDirOption = Annotated[
    Path | None,
    typer.Option(help="Project folder flow runs execute in (holds deploy/prefect.yaml). Default: the current folder."),
]


def _project(project_dir: Path | None) -> Path:
    """The project folder the deployments run in, or one line and status 2."""
    from pipeline.orchestration.deployments import NotAProject, project_folder

    try:
        return project_folder(project_dir)
    except NotAProject as exc:
        console.print(f"[red]server:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@server_app.command("start")
def server_start(
    port: Annotated[int, typer.Option(help="Port of the server and its UI, on 127.0.0.1.")] = 4200,
    gpu_slots: Annotated[int, typer.Option(help="Slots of the `gpu` concurrency limit: GPUs on this machine.")] = 1,
    project_dir: ProjectDirOption = None,
) -> None:
    """Start the server and a worker in the background, create the pools, deploy deploy/prefect.yaml.

    The deployments run in the project folder and hand their flow runs this command's config and
    workspace as absolute paths, so runs from the UI write where this command's CLI would.
    """
    from pipeline.orchestration.prefect_server import LocalServer, ServerError

    project = _project(project_dir)
    config = _config()
    config_path = _state.get("config_path")
    server = LocalServer(config.workspace.prefect_home, port, project)
    try:
        server.start(config.workspace.root, Path(config_path).resolve() if config_path else None, gpu_slots)
    except ServerError as exc:
        console.print(f"[red]server:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:  # stale pid files it removed, also where it then refused to start (a UserFixableError: status 2)
        _print_server_notes(server)
    console.print(
        f"Prefect UI at http://127.0.0.1:{port}; runs: `prefect deployment run world-model-pipeline/world-model-pipeline`",
        soft_wrap=True,
    )
    console.print(f"flow runs execute in {project} and write {config.workspace.root}", soft_wrap=True)
    console.print(
        f"export PREFECT_API_URL={server.api_url} to use the prefect CLI against it; logs in {server.home}",
        soft_wrap=True,
    )


@server_app.command("deploy")
def server_deploy(project_dir: ProjectDirOption = None) -> None:
    """Deploy deploy/prefect.yaml again to this workspace's running server, bound to this config and workspace.

    After editing the file (the nightly refresh's cron, a deployment's parameters): `prefect deploy` by hand would
    deploy it unbound, pointing the nightly refresh at data/configs/demo.yaml and another workspace.
    """
    from pipeline.orchestration.prefect_server import LocalServer, ServerError

    project = _project(project_dir)
    config = _config()
    config_path = _state.get("config_path")
    server = LocalServer.of_workspace(config.workspace.prefect_home)
    server.project = project
    try:
        bound = server.deploy(config.workspace.root, Path(config_path).resolve() if config_path else None)
    except ServerError as exc:
        console.print(f"[red]server:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        _print_server_notes(server)
    console.print(f"deployed {bound} to {server.api_url}: runs write {config.workspace.root}", soft_wrap=True)


@server_app.command("stop")
def server_stop() -> None:
    """Stop the worker and the server this workspace started."""
    from pipeline.orchestration.prefect_server import LocalServer

    server = LocalServer.of_workspace(_config().workspace.prefect_home)
    stopped = server.stop()
    _print_server_notes(server)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@server_app.command("status")
def server_status() -> None:
    """Whether this workspace's server and worker are running, and where."""
    from pipeline.orchestration.prefect_server import LocalServer

    server = LocalServer.of_workspace(_config().workspace.prefect_home)
    status = server.status()
    _print_server_notes(server)  # on stderr: stdout stays the JSON
    print(json.dumps(status, indent=2))


def _print_server_notes(server) -> None:
    """What `server start|stop|status` found and set right on the way (a stale pid file removed), a line each."""
    for note in server.notes:
        console.print(Text.assemble(("server: ", "yellow"), note), soft_wrap=True)


if __name__ == "__main__":
    sys.exit(app())
