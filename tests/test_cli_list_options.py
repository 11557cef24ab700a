"""`simulacra evaluate --data a.jsonl b.jsonl`, as the docs show it (issue 30): a list option takes every
value up to the next option, and repeating it works as before. Parsed by the real command, not run; and the
notice that `evaluate.max_queries` does not limit `--data` files."""

import pytest
import typer.main

from pipeline import cli
from pipeline.cli import repeat_list_options


@pytest.mark.parametrize(
    ("args", "data", "checkpoint", "thinking"),
    [
        (["--data", "a.jsonl", "b.jsonl"], ["a.jsonl", "b.jsonl"], (), False),
        (["--data", "a.jsonl", "b/", "--thinking"], ["a.jsonl", "b/"], (), True),
        (["--data", "a", "--data", "b"], ["a", "b"], (), False),
        (["--data=a", "b", "--checkpoint", "x", "y"], ["a", "b"], ["x", "y"], False),
        (["--checkpoint", "x", "--data", "a", "b", "c"], ["a", "b", "c"], ["x"], False),
        (["--thinking"], (), (), True),
    ],
)
def test_evaluate_takes_several_values_after_one_option(args, data, checkpoint, thinking):
    evaluate = typer.main.get_command(cli.app).commands["evaluate"]
    params = evaluate.make_context("evaluate", list(args)).params
    assert (params["data"], params["checkpoint"], params["thinking"]) == (data, checkpoint, thinking)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--data", "a", "b"], ["--data", "a", "--data", "b"]),
        (["--data", "a", "--", "b"], ["--data", "a", "--", "b"]),  # after `--`, nothing is an option's value
        (["--thinking", "a"], ["--thinking", "a"]),  # a value after another option is left for Click to refuse
        (["--data"], ["--data"]),  # Click says the option needs a value
    ],
)
def test_repeat_list_options(args, expected):
    assert repeat_list_options(args, ("--data", "--checkpoint")) == expected


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (["evaluate.max_queries=12"], True),
        (["evaluate.max_queries=12", "evaluate.benchmark.max_items_per_path=12"], False),
        ([], False),
    ],
)
def test_a_query_budget_that_does_not_apply_to_data_files_says_so(tmp_path, settings, said):
    """`--set evaluate.max_queries=12 evaluate --data tau_bench`: the budget limits the eval pool only, and a check
    meant for 12 targets asked all 413 without a word."""
    from typer.testing import CliRunner

    options = [item for setting in [f"workspace.path={tmp_path / 'ws'}", *settings] for item in ("--set", setting)]
    result = CliRunner().invoke(cli.app, [*options, "evaluate", "--data", str(tmp_path / "nope.jsonl")])
    assert result.exit_code == 2  # the missing file, after the notice
    notice = "evaluate: evaluate.max_queries (12) limits the eval pool, not --data files, whose every target is scored"
    assert (notice in result.output) == said
