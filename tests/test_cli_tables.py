"""Tables a command prints where its output is not a terminal (a pipe, a file, a CI log): whole, at 160 columns.
At rich's default of 80, `simulacra stats | less` showed "sou…", "turn_…" and "termi…" for its headers and sources.
CliRunner's output is not a terminal, as a pipe is not. A real store of the demo's terminal sessions."""

from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli import app

TERMINAL = Path(__file__).resolve().parents[1] / "data" / "demo" / "terminal.jsonl"


def test_stats_and_formats_print_every_header_and_value_whole(tmp_path):
    runner = CliRunner()
    workspace = ["--set", f"workspace.path={tmp_path / 'ws'}"]
    for command in (["ingest", str(TERMINAL)], ["filter"], ["score"]):
        assert runner.invoke(app, [*workspace, *command]).exit_code == 0
    stats = runner.invoke(app, [*workspace, "stats"])
    assert stats.exit_code == 0, stats.output
    for whole in ("records_read", "quarantined", "kept_turns", "observation_chars", "kept_char_share", "retrieval"):
        assert whole in stats.output, whole
    assert "…" not in stats.output
    formats = runner.invoke(app, ["formats"])
    assert formats.exit_code == 0 and "…" not in formats.output and "simulacra-jsonl" in formats.output
