"""`simulacra evaluate --data a.jsonl b.jsonl`, as the docs show it (issue 30): a list option takes every
value up to the next option, and repeating it works as before. Parsed by the real command, not run."""

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
