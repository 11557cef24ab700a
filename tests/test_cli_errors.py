"""A problem the user can fix is one line naming the fix and exit status 2, whichever command hits
it; a bug keeps its traceback. Real stores, the real command group (typer's CliRunner), and once
as a process."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.store.database import Store

REPO = Path(__file__).resolve().parents[1]
TERMINAL = str(REPO / "data" / "demo" / "terminal.jsonl")


def simulacra(workspace: Path, *args: str):
    return CliRunner().invoke(app, ["--set", f"workspace.path={workspace}", *args])


def forget_migration(workspace: Path) -> None:
    """The store as the version before migration 3 left it."""
    with Store(workspace / "simulacra.duckdb") as store:
        store.execute("ALTER TABLE splits DROP COLUMN group_key")
        store.execute("DELETE FROM schema_migrations WHERE version = 3")


def migrate_by_a_newer_version(workspace: Path) -> None:
    with Store(workspace / "simulacra.duckdb") as store:
        store.execute("INSERT INTO schema_migrations VALUES (999, 'a newer simulacra', now())")


def not_a_store(workspace: Path) -> None:
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "simulacra.duckdb").write_text("hello\n")


def cut_short(workspace: Path) -> None:
    store = workspace / "simulacra.duckdb"
    store.write_bytes(store.read_bytes()[:1000])


def a_block_overwritten(workspace: Path) -> None:
    with (workspace / "simulacra.duckdb").open("r+b") as handle:
        handle.seek(3 * 4096)
        handle.write(os.urandom(4096))


DAMAGED = "{workspace}/simulacra.duckdb is damaged or not a DuckDB file ("

# (commands run first, or functions of the workspace; the command; the one line it must print)
CASES = [
    (
        "cpt on an empty workspace",
        [],
        ["cpt"],
        "cpt: no store at {workspace}/simulacra.duckdb: run `simulacra ingest` first (or check `workspace.path`)",
    ),
    (
        "cpt before split",
        [["ingest", TERMINAL]],
        ["cpt"],
        "cpt: pool 'cpt' holds no trajectory: run `simulacra split` first",
    ),
    (
        "sft before cpt",
        [["ingest", TERMINAL], ["filter"], ["score"], ["split"]],
        ["sft"],
        "sft: sft starts from the CPT checkpoint and none is registered: run `simulacra cpt` first",
    ),
    (
        "cpt before scoring",
        [["ingest", TERMINAL], ["filter"], ["split"]],
        ["cpt"],
        "cpt: 385 turn(s) of pool 'cpt' have no row in turn_scores (e.g. trajectory 00e7f8b5d3073192355eb865de8ca1c4 "
        "turn 0): run `simulacra score` first",
    ),
    (
        "cpt after the keep ratios changed",
        [["ingest", TERMINAL], ["filter"], ["score"], ["split"]],
        ["--set", "score.keep_ratios.echo=0.9", "cpt"],
        "cpt: 385 turn(s) of pool 'cpt' were scored under another `score` config or scorer version",
    ),
    (
        "split before ingest",
        [],
        ["split"],
        "split: no store at {workspace}/simulacra.duckdb: run `simulacra ingest` first (or check `workspace.path`)",
    ),
    (
        "run with a stage that does not exist",
        [],
        ["run", "--stages", "ingest,bogus"],
        "unknown stage(s) bogus; stages are ingest, filter, score, split, cpt, sft, rl, evaluate, fidelity, export",
    ),
    (
        "filter before ingest",
        [],
        ["filter"],
        "filter: no store at {workspace}/simulacra.duckdb: run `simulacra ingest` first (or check `workspace.path`)",
    ),
    (
        "score before ingest",
        [],
        ["score"],
        "score: no store at {workspace}/simulacra.duckdb: run `simulacra ingest` first (or check `workspace.path`)",
    ),
    (
        "score before filter",
        [["ingest", TERMINAL]],
        ["score"],
        "score: no trajectory has been filtered yet: run `simulacra filter` first",
    ),
    (
        "split before filter",
        [["ingest", TERMINAL]],
        ["split"],
        "split: no trajectory has been filtered yet: run `simulacra filter` first",
    ),
    (
        "a workspace that cannot be written",
        [],
        ["--set", f"workspace.path={REPO}/pyproject.toml/ws", "split"],
        f"split: cannot write the store {REPO}/pyproject.toml/ws/simulacra.duckdb (Not a directory): set `workspace.path` "
        "to a folder you can write, or fix its permissions",
    ),
    (
        "ingest of a missing path",
        [],
        ["ingest", "/nonexistent/runs"],
        "ingest: /nonexistent/runs: no such file, folder or glob match",
    ),
    (
        "ingest into a workspace its owner made read-only",
        [lambda workspace: workspace.chmod(0o555)],
        ["ingest", TERMINAL],
        "ingest: cannot write {workspace}: it is mode 0555, which withholds rwx from its owner",
    ),
    (
        "ingest with a domain that is none",  # was pydantic's four lines, its web address among them
        [],
        ["ingest", "--domain", "spaceship", TERMINAL],
        "ingest: unknown domain `spaceship`: --domain is one of terminal, swe, mcp, search, web, android, os, "
        "text-game, other",
    ),
    (
        "stats before any data",
        [],
        ["stats"],
        "stats: no store at {workspace}/simulacra.duckdb: run `simulacra ingest` first",
    ),
    (
        "stats of a store an older version wrote",
        [["ingest", TERMINAL], forget_migration],
        ["stats"],
        "stats: {workspace}/simulacra.duckdb lacks migration(s) 3 (pool group keys), and a read-only command cannot "
        "apply them: run a command that writes to it first (e.g. `simulacra split`)",
    ),
    # A store migrated by a newer simulacra was written to as the old schema without a word.
    *(
        (
            f"{command} of a store a newer version migrated",
            [["ingest", TERMINAL], migrate_by_a_newer_version],
            [command],
            f"{command}: {{workspace}}/simulacra.duckdb was migrated by a newer simulacra (schema version 999; this "
            "one knows up to ",
        )
        for command in ("stats", "filter")
    ),
    # Each of these was DuckDB's traceback, exit 1, in every command.
    ("a store that is not a DuckDB file", [not_a_store], ["stats"], f"stats: the store {DAMAGED}The file "),
    ("a store cut short", [["ingest", TERMINAL], cut_short], ["filter"], f"filter: the store {DAMAGED}Could not "),
    (
        "a store with a damaged block",
        [["ingest", TERMINAL], a_block_overwritten],
        ["stats"],
        f"stats: the store {DAMAGED}Corrupt database file: ",
    ),
]


@pytest.mark.parametrize(("before", "command", "line"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_user_fixable_problem_is_one_line_and_exit_2(tmp_path, before, command, line):
    for step in before:
        if callable(step):
            step(tmp_path)
            continue
        assert simulacra(tmp_path, *step).exit_code == 0, step
    result = simulacra(tmp_path, *command)
    assert result.exit_code == 2
    assert result.stdout == ""
    [printed] = result.stderr.splitlines()
    assert printed.startswith(line.format(workspace=tmp_path))
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_a_base_model_that_cannot_be_loaded_is_one_line_naming_it(tmp_path):
    """A folder that is not a model, and a hub name this offline machine cannot get (HF_HUB_OFFLINE: no request is
    tried), where each ended CPT in transformers' traceback."""
    for step in (["ingest", TERMINAL], ["filter"], ["score"], ["split"]):
        assert simulacra(tmp_path, *step).exit_code == 0, step
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    result = simulacra(tmp_path, "--set", f"model.base={empty}", "cpt")
    assert result.exit_code == 2 and result.stdout == ""
    [printed] = result.stderr.splitlines()
    assert printed.startswith(f"cpt: {empty} is not a complete model folder (")
    assert printed.endswith("): point model.base (or the stage's base_model) at one, or rerun the stage that wrote it")

    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--set", f"workspace.path={tmp_path}"]
        + ["--set", "model.base=someone/not-a-model", "cpt"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "COLUMNS": "300"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "cpt: model someone/not-a-model is neither a local folder nor one the Hugging Face Hub gave ("
    )
    assert last.endswith("and set model.base to DIR")


def plot_on_a_full_disk(workspace: Path) -> Path:
    """Where score draws its plot, /dev/full: the device answers every write with ENOSPC, as a full disk does."""
    plot = workspace / "runs" / "score" / "categories.png"
    plot.parent.mkdir(parents=True, exist_ok=True)
    plot.symlink_to("/dev/full")
    return plot


def test_a_full_disk_is_one_line_naming_the_fix_and_the_rerun_resumes(tmp_path):
    for step in (["ingest", TERMINAL], ["filter"]):
        assert simulacra(tmp_path, *step).exit_code == 0, step
    plot = plot_on_a_full_disk(tmp_path)
    result = simulacra(tmp_path, "score")
    assert result.exit_code == 2 and result.stdout == ""
    [printed] = result.stderr.splitlines()
    assert printed.startswith("score: a write failed because the disk is full or over its quota (")
    assert printed.endswith(f" free at {tmp_path}): free space there, then rerun the same command to resume")
    plot.unlink()
    assert simulacra(tmp_path, "score").exit_code == 0
    assert plot.stat().st_size > 0


def _python_write(path: Path) -> None:
    path.write_text("x")


def _torch_checkpoint(path: Path) -> None:
    import torch

    torch.save({"w": torch.zeros(10_000)}, path)


def _duckdb_copy(path: Path) -> None:
    import duckdb

    duckdb.connect().execute(f"COPY (SELECT 1) TO '{path}' (FORMAT csv)")


# A real write to /dev/full through each writer the stages use, and how the error reaches the code.
FULL_DISK_WRITES = {"python": _python_write, "torch checkpoint": _torch_checkpoint, "duckdb": _duckdb_copy}


@pytest.mark.parametrize("write", FULL_DISK_WRITES.values(), ids=FULL_DISK_WRITES.keys())
def test_a_full_disk_is_recognised_from_each_writer_and_through_a_chain(tmp_path, write):
    from pipeline.errors import full_disk

    target = tmp_path / "out"
    target.symlink_to("/dev/full")
    with pytest.raises(Exception) as raised:
        write(target)
    line = full_disk(raised.value, tmp_path)
    assert line is not None and f"free at {tmp_path})" in line
    try:
        raise RuntimeError("saving the checkpoint failed") from raised.value
    except RuntimeError as wrapped:
        assert full_disk(wrapped, tmp_path) == line
    assert full_disk(FileNotFoundError(2, "No such file or directory", str(target)), tmp_path) is None
    assert full_disk(RuntimeError("position 7 unexpected"), tmp_path) is None


def test_a_bug_keeps_its_traceback(tmp_path, monkeypatch):
    from stages import split

    def broken(config, store):
        raise KeyError("a bug, not the user's")

    monkeypatch.setattr(split, "run", broken)
    result = simulacra(tmp_path, "split")
    assert result.exit_code == 1 and isinstance(result.exception, KeyError)


def test_the_installed_command_prints_no_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "--set", f"workspace.path={tmp_path}", "cpt"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == f"cpt: no store at {tmp_path}/simulacra.duckdb: run `simulacra ingest` first (or check `workspace.path`)\n"
    )


def test_a_config_error_keeps_each_field_on_one_line_whatever_the_terminal_width(tmp_path):
    """Issue 20.19: the field line used to wrap at the console's 80 columns."""
    result = simulacra(
        tmp_path, "--set", "sft.judge.endpoint.base_url=http://user:SECRET@gpu-node.example.org:8000/v1", "split"
    )
    assert result.exit_code == 2
    header, field = result.stderr.splitlines()
    assert header == "config error: <defaults> (with overrides): invalid configuration"
    assert len(field) > 80 and field.startswith("  field `sft.judge.endpoint.base_url`: the URL holds credentials")
    assert field.endswith("or in a Prefect Secret block (`api_key_secret`)") and "SECRET" not in result.stderr


def test_credentials_in_a_url_stop_a_pipeline_run_before_prefect_records_its_parameters(tmp_path):
    """Issue 20.10: the flow run's parameters hold the overrides; the refusal comes before the flow starts."""
    result = simulacra(
        tmp_path, "run", "--stages", "ingest", "--set", "evaluate.judge.endpoint.base_url=http://u:SECRET@host/v1"
    )
    assert result.exit_code == 2 and "SECRET" not in result.stderr
    assert "field `evaluate.judge.endpoint.base_url`: the URL holds credentials (user info)" in result.stderr
    assert not (tmp_path / "prefect").exists()


def test_a_prefect_database_sqlite_cannot_read_is_one_line_before_any_server_starts(tmp_path):
    """Overwritten, Prefect's database had its server fail on every try: 29 tracebacks over two minutes. Now one
    line naming the file and the fix, at once; the store is not touched, and the file is left as it was."""
    database = tmp_path / "prefect" / "prefect.db"
    database.parent.mkdir(parents=True)
    database.write_bytes(b"not SQLite " * 500)
    result = simulacra(
        tmp_path, "--set", f"ingest.sources=[{{name: t, path: {TERMINAL}}}]", "run", "--stages", "ingest"
    )
    assert result.exit_code == 2
    [printed] = result.stderr.splitlines()
    assert printed == (
        f"run: Prefect's database {database} cannot be read (file is not a database): it holds Prefect's run history, "
        f"not the store; move it aside (`mv {database} {database}.unreadable`) and rerun: Prefect starts a new one"
    )
    assert database.read_bytes() == b"not SQLite " * 500 and not (tmp_path / "simulacra.duckdb").exists()


@pytest.mark.parametrize("stage", ["cpt", "sft", "rl", "evaluate", "fidelity"])
def test_a_training_or_evaluating_stage_over_an_empty_store_names_ingest(tmp_path, stage):
    """A store that exists and holds nothing (made by `simulacra run --stages cpt` in a new workspace, or by an
    ingest that read nothing) sent the user to `split`, `cpt` or `sft` first, each of which would fail in turn."""
    with Store(tmp_path / "simulacra.duckdb") as store:
        assert store.scalar("SELECT count(*) FROM trajectories") == 0  # created, migrated, empty
    result = simulacra(tmp_path, stage)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"{stage}: the store holds no trajectory: run `simulacra ingest` first"]


@pytest.mark.parametrize("option", ["--max-tokens", "--max-batch"])
def test_serve_refuses_a_budget_of_no_tokens_before_loading_anything(tmp_path, option):
    # Found by probing: `serve --max-tokens 0` started, and every request that set no max_tokens got one token.
    result = CliRunner().invoke(app, ["serve", str(tmp_path), option, "0"])
    assert result.exit_code == 2
    assert f"Invalid value for '{option}'" in result.output and "greater than or equal to 1" in result.output
