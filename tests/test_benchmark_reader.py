"""Benchmark files read as given (issue 18): AgentWorldBench rows written here in the benchmark's schema,
designated target turns in the project's own JSONL, the history in full unless a cut is asked, the
benchmark's marker stripping, and the strict agreement metrics. Real files on disk, no store."""

import json

import pytest

from pipeline.evaluation.agreement import exact, line_agreement
from pipeline.evaluation.benchmark import read_benchmark, strip_marker
from pipeline.formats import detect

MARKER = "**Environment Observation:**"
SYSTEM = "# Role and Objective\n\nYou are a **Terminal World Model**."


def awb_row(turn_idx: int, **changes) -> dict:
    """A row of AgentWorldBench's `terminal_test.jsonl` (README, "Data Format"): the whole trajectory in
    `prompt` / `response`, the scored turn in `turn_idx` (1-indexed)."""
    prompts = [
        f"### Turn {i}\n**Action:**\n```\n{cmd}\n```" for i, cmd in enumerate(["mkdir x", "ls", "cat a"], start=1)
    ]
    responses = [f"{MARKER}\n", f"{MARKER}\nx\n", f"{MARKER}\ncat: a: No such file or directory\n"]
    row = {
        "task": "agentworldbench/terminal",
        "id": 7001 + turn_idx,
        "prompt": prompts,
        "response": responses,
        "current_prompt": prompts[turn_idx - 1],
        "system_str": SYSTEM,
        "turn_idx": turn_idx,
        "total_turns": 3,
    }
    row.update(changes)
    return row


def _write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_agentworldbench_rows_are_scored_at_their_turn_with_their_prompt_and_full_history(tmp_path):
    path = _write_jsonl(tmp_path / "terminal_test.jsonl", [awb_row(1), awb_row(3), awb_row(0), awb_row(3)])
    assert detect(awb_row(2)).name == "agentworldbench"
    read = read_benchmark([path], "benchmark_target", None)

    assert (read.records_read, read.records_failed, read.duplicates, len(read.items)) == (4, 1, 1, 2)
    assert "turn_idx" in read.failures[0]  # turn_idx 0 is not a turn: counted with its reason
    first, third = read.items
    assert (
        first.query.history == ()
        and first.query.action.endswith("mkdir x\n```")
        and first.query.reference == f"{MARKER}\n"
    )
    assert [t.action for t in third.query.history] == awb_row(3)["prompt"][:2]  # every earlier turn, as given
    assert [t.observation for t in third.query.history] == awb_row(3)["response"][:2]
    assert third.query.reference == awb_row(3)["response"][2] and third.query.history_left_out == 0
    assert third.query.domain == "terminal" and third.system_prompt == SYSTEM and third.response_marker == MARKER
    assert read.designated == 2 and read.every_turn == 0


def test_history_is_cut_only_when_asked_and_each_item_says_how_much(tmp_path):
    path = _write_jsonl(tmp_path / "terminal_test.jsonl", [awb_row(3)])
    [item] = read_benchmark([path], "benchmark_target", 80).items
    assert len(item.query.history) == 1 and item.query.history_left_out == 1


def _trajectory(turns: list[tuple[str, str, dict]]) -> dict:
    return {
        "schema": "simulacra/trajectory-v1",
        "domain": "terminal",
        "task": "t",
        "system": {"task_description": "a shell"},
        "turns": [{"action": a, "observation": o, **({"metadata": m} if m else {})} for a, o, m in turns],
    }


@pytest.mark.parametrize(
    ("field", "turns", "expected_targets", "designated"),
    [
        # Only the marked turn is scored: never the first, last and middle turns the eval pool would choose.
        (
            "benchmark_target",
            [("ls", "a", {}), ("cat a", "1", {"benchmark_target": True}), ("ls", "a", {}), ("pwd", "/", {})],
            [1],
            True,
        ),
        # The field name is configuration.
        ("scored", [("ls", "a", {"scored": True}), ("pwd", "/", {"scored": True})], [0, 1], True),
        ("scored", [("ls", "a", {"benchmark_target": True}), ("pwd", "/", {})], [0, 1], False),
        # A one-turn trajectory is scored (no min_turns), and so is a turn with an empty observation.
        ("benchmark_target", [("mkdir x", "", {})], [0], False),
    ],
)
def test_designated_targets_are_scored_exactly(tmp_path, field, turns, expected_targets, designated):
    path = _write_jsonl(tmp_path / "bench.jsonl", [_trajectory(turns)])
    read = read_benchmark([path], field, None)
    assert [item.query.turn_index for item in read.items] == expected_targets
    assert (read.designated, read.every_turn) == (
        (len(expected_targets), 0) if designated else (0, len(expected_targets))
    )
    assert all(item.system_prompt is None for item in read.items)  # no own prompt: the model's trained template


@pytest.mark.parametrize(
    ("text", "marker", "expected"),
    [
        (f"{MARKER}\nx\n", MARKER, "x"),
        ("x\n", MARKER, "x"),  # eval.py strips whitespace also where the marker is absent
        (f"<answer>\n{MARKER} x", MARKER, "<answer>\n x"),  # the marker elsewhere is removed, not the text around it
        ("x\n", None, "x\n"),  # no benchmark marker: nothing changes
    ],
)
def test_marker_is_stripped_as_the_benchmark_judge_does(text, marker, expected):
    assert strip_marker(text, marker) == expected


@pytest.mark.parametrize(
    ("prediction", "reference", "is_exact", "agreement"),
    [
        ("a\nb\n", "a\nb", True, 1.0),
        ("", "", True, 1.0),
        ("built 2026-11-30", "built 2024-01-02", False, 0.0),  # nothing masked: a timestamp is a difference
        ("a\nb\nc\nX", "a\nb\nc\nd", False, 0.75),  # three of four lines agree
        ("a  \nb", "a\nb", False, 1.0),  # trailing spaces differ the text, not the lines
        ("", "a", False, 0.0),
    ],
)
def test_exact_and_per_line_agreement(prediction, reference, is_exact, agreement):
    assert exact(prediction, reference) is is_exact
    assert line_agreement(prediction, reference) == pytest.approx(agreement)


def _paths_of(tmp_path, sizes: dict[str, int]) -> list[str]:
    """One file per name, its trajectories of one turn each (every turn a target)."""
    return [
        _write_jsonl(tmp_path / f"{name}.jsonl", [_trajectory([(f"cat {name}{i}", f"{i}", {})]) for i in range(size)])
        for name, size in sizes.items()
    ]


@pytest.mark.parametrize(
    ("budget", "kept_per_path"),
    [
        (None, {"big": 30, "small": 4}),  # no budget: every item
        (10, {"big": 10, "small": 4}),  # each path keeps its share; a small one keeps all of its items
        (40, {"big": 30, "small": 4}),
    ],
)
def test_a_budget_per_path_keeps_a_seeded_share_of_each(tmp_path, budget, kept_per_path):
    read = read_benchmark(_paths_of(tmp_path, {"big": 30, "small": 4}), "benchmark_target", None, budget, seed=0)
    kept = {name: sum(item.query.action.startswith(f"cat {name}") for item in read.items) for name in kept_per_path}
    assert kept == kept_per_path
    assert read.capped == 34 - len(read.items) and read.every_turn == 34  # counted as read, before the budget


def test_the_budgets_choice_is_the_same_at_every_run_and_a_larger_budget_a_superset(tmp_path):
    paths = _paths_of(tmp_path, {"big": 30})

    def chosen(budget: int, seed: int = 0) -> set[str]:
        return {item.query.query_id for item in read_benchmark(paths, "benchmark_target", None, budget, seed).items}

    assert chosen(10) == chosen(10)
    assert chosen(10) < chosen(20)
    assert chosen(10, seed=1) != chosen(10)  # the seed decides which


def test_the_eval_set_says_how_many_items_were_read_and_how_many_kept(tmp_path):
    from pipeline.config import load_config
    from stages.evaluate import _benchmark_items

    config = load_config(None, [{"evaluate": {"seed": 3, "benchmark": {"max_items_per_path": 10}}}])
    items, counts, name = _benchmark_items(config, _paths_of(tmp_path, {"big": 30, "small": 4}))
    assert (len(items), counts["items"], counts["items_read"]) == (14, 14, 34)
    assert name.endswith("14 of 34 kept, at most 10 a path (seed 3))")


def _opening_alike(tmp_path, runs: int) -> str:
    """`runs` runs of one task that ask the same first command and get the same answer, then part ways."""
    rows = [_trajectory([("ls", "a b", {}), (f"cat run{run}", f"contents of run {run}", {})]) for run in range(runs)]
    return _write_jsonl(tmp_path / "alike.jsonl", rows)


def test_runs_that_open_alike_ask_their_shared_query_once(tmp_path):
    read = read_benchmark([_opening_alike(tmp_path, 3)], "benchmark_target", None)
    asked = [(item.query.action, item.query.reference) for item in read.items]
    assert asked.count(("ls", "a b")) == 1 and len(asked) == 4  # one `ls` and each run's own `cat`
    assert (read.repeats, read.duplicates, read.capped) == (2, 0, 0)


def test_a_repeat_passed_over_gives_its_place_to_the_next_in_order(tmp_path):
    path = _opening_alike(tmp_path, 6)  # 12 items, 7 distinct queries
    for budget in (3, 5, 7):
        read = read_benchmark([path], "benchmark_target", None, budget, seed=0)
        contents = [(item.query.action, item.query.reference) for item in read.items]
        assert len(contents) == budget and len(set(contents)) == budget
        assert len(read.items) + read.capped + read.repeats == 12  # every item read is accounted for
    # A repeat of an item an earlier path kept is passed over too.
    again = _write_jsonl(tmp_path / "again.jsonl", [_trajectory([("ls", "a b", {})])])
    read = read_benchmark([path, again], "benchmark_target", None)
    assert (len(read.items), read.repeats) == (7, 6)


def test_the_eval_set_counts_the_repeats_it_passed_over(tmp_path):
    from pipeline.config import load_config
    from stages.evaluate import _benchmark_items

    config = load_config(None, [{"evaluate": {"seed": 3}}])
    items, counts, name = _benchmark_items(config, [_opening_alike(tmp_path, 3)])
    assert (len(items), counts["repeats"], counts["items_read"]) == (4, 2, 6)
    assert "2 items repeating another's query" in name


def test_a_folder_is_read_as_ingest_reads_one_its_licence_and_readme_left_out(tmp_path):
    """`evaluate --data FOLDER` read every file in it: the public folders' LICENSE files counted as three records
    failing to parse in `make learn`. A folder's walk now takes ingest's data files, a gzipped one among them; a file
    named on its own is read whatever its name."""
    import gzip

    folder = tmp_path / "published"
    folder.mkdir()
    _write_jsonl(folder / "runs.jsonl", [_trajectory([("ls", "a b", {})])])
    (folder / "more.jsonl.gz").write_bytes(gzip.compress(json.dumps(_trajectory([("pwd", "/w", {})])).encode()))
    (folder / "LICENSE").write_text("MIT License\n\nPermission is hereby granted, free of charge ...\n")
    (folder / "README.md").write_text("# Trajectories\n\n> published with the paper\n")
    (folder / ".ipynb_checkpoints").mkdir()  # a stale copy, as JupyterLab keeps one: not a second record
    _write_jsonl(folder / ".ipynb_checkpoints" / "runs-checkpoint.jsonl", [_trajectory([("ls", "a b", {})])])
    read = read_benchmark([str(folder)], "benchmark_target", None)
    assert sorted(item.query.action for item in read.items) == ["ls", "pwd"]
    assert (read.records_read, read.records_failed) == (2, 0)
    named = read_benchmark([str(folder / "LICENSE")], "benchmark_target", None)
    assert (named.records_read, named.records_failed) == (1, 1)  # asked for by name: read, and said why it failed


def test_a_credential_in_a_benchmark_file_never_reaches_a_prompt(tmp_path):
    """Files given to `evaluate --data` and `fidelity --data` are not ingested, so ingest's redaction never saw
    them; their text went as written into the prompts of the models and of the judge."""
    key = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    row = awb_row(3, system_str=SYSTEM + f"\nGITHUB_TOKEN={key}")
    row["response"][1] = f"{MARKER}\nexport GITHUB_TOKEN={key}\n"
    shell = _trajectory([(f"echo {key}", key, {}), ("env | grep TOKEN", f"GITHUB_TOKEN={key}", {})])
    read = read_benchmark(
        [_write_jsonl(tmp_path / "awb.jsonl", [row]), _write_jsonl(tmp_path / "shell.jsonl", [shell])],
        "benchmark_target",
        None,
    )
    assert len(read.items) == 3
    for item in read.items:
        texts = [item.system_prompt or "", item.query.action, item.query.reference]
        texts += [text for turn in item.query.history for text in (turn.action, turn.observation)]
        assert not any(key in text for text in texts), texts
    assert "GITHUB_TOKEN=[redacted-secret]" in read.items[-1].query.reference
