"""Progress where output is not a terminal (issue 30): a line at the start and each 5% done, with the
count, the rate and the ETA, at least a second apart; a bar without a total prints its count every
30 s. Read from the real `progress_bar` writing to a non-terminal stream, and from `ProgressLines`
under a fake clock."""

import pytest

from pipeline import progress
from pipeline.progress import ProgressLines, progress_bar


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def lines_of(total, steps, seconds_a_step, status=None):
    """Advance one unit a step, each taking `seconds_a_step`; the lines printed."""
    printed, clock = [], FakeClock()
    bar = ProgressLines("evaluate base", total, lambda text, **_: printed.append(text), clock)
    for completed in range(1, steps + 1):
        clock.now += seconds_a_step
        bar.advance(completed, status)
    return printed


@pytest.mark.parametrize(
    ("total", "steps", "seconds", "expected"),
    [
        # 46 items of 2 s: nothing more until another 5% is done (item 3 of 46: 6.5%).
        (46, 2, 2.0, ["evaluate base: started, 46 to do"]),
        (46, 3, 2.0, ["evaluate base: started, 46 to do", "evaluate base: 3/46 (7%), 0.5/s, elapsed 0:06, eta 1:26"]),
        (
            4,
            4,
            30.0,
            [
                "evaluate base: started, 4 to do",
                "evaluate base: 1/4 (25%), 0.0333/s, elapsed 0:30, eta 1:30",
                "evaluate base: 2/4 (50%), 0.0333/s, elapsed 1:00, eta 1:00",
                "evaluate base: 3/4 (75%), 0.0333/s, elapsed 1:30, eta 0:30",
                "evaluate base: 4/4 (100%), 0.0333/s, elapsed 2:00",
            ],
        ),
        # A bar of half a second: its start line only.
        (100, 100, 0.005, ["evaluate base: started, 100 to do"]),
        # Each item 5%, four a second: a line a second, not one an item; the end is printed.
        (
            20,
            20,
            0.25,
            [
                "evaluate base: started, 20 to do",
                "evaluate base: 4/20 (20%), 4/s, elapsed 0:01, eta 0:04",
                "evaluate base: 8/20 (40%), 4/s, elapsed 0:02, eta 0:03",
                "evaluate base: 12/20 (60%), 4/s, elapsed 0:03, eta 0:02",
                "evaluate base: 16/20 (80%), 4/s, elapsed 0:04, eta 0:01",
                "evaluate base: 20/20 (100%), 4/s, elapsed 0:05",
            ],
        ),
        # No total: the count every 30 s, no start line (ingest opens a bar per file).
        (None, 7, 10.0, ["evaluate base: 3 done, 0.1/s, elapsed 0:30", "evaluate base: 6 done, 0.1/s, elapsed 1:00"]),
    ],
)
def test_lines(total, steps, seconds, expected):
    assert lines_of(total, steps, seconds) == expected


def test_a_line_every_five_percent_and_one_at_the_end():
    printed = lines_of(1000, 1000, 0.1)
    assert len(printed) == 1 + 20
    assert printed[1] == "evaluate base: 50/1000 (5%), 10/s, elapsed 0:05, eta 1:35"
    assert printed[-1] == "evaluate base: 1000/1000 (100%), 10/s, elapsed 1:40"


def test_status_follows_the_count():
    printed = lines_of(2, 1, 1.0, status="3 done, 1 cached, 0 failed")
    assert printed[-1] == "evaluate base: 1/2 (50%), 1/s, elapsed 0:01, eta 0:01 (3 done, 1 cached, 0 failed)"


def test_hours():
    printed = lines_of(2, 1, 3723.0)
    assert printed[-1] == "evaluate base: 1/2 (50%), 0.000269/s, elapsed 1:02:03, eta 1:02:03"


def test_progress_bar_prints_lines_to_a_non_terminal(capsys, monkeypatch):
    """The helper the stages use, its stderr a pipe (pytest's capture), as under nohup or a Prefect worker."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "MIN_SECONDS_BETWEEN_LINES", 0.0)  # the loop below takes no time
    seen = []
    monkeypatch.setattr(progress, "OBSERVERS", [lambda *args: seen.append(args)])
    with progress_bar("sft queries sampled and judged [demo]", total=40) as advance:
        for _ in range(40):
            advance(1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "sft queries sampled and judged [demo]: started, 40 to do"
    assert len(lines) == 1 + 20
    assert lines[-1].startswith("sft queries sampled and judged [demo]: 40/40 (100%), ")
    assert all("eta" in line for line in lines[1:-1])
    assert seen[-1] == ("sft queries sampled and judged [demo]", 40, 40)  # the Prefect artifact's observer still told


def test_each_line_reaches_the_log_when_it_is_printed(capsys, monkeypatch):
    """Not when the bar ends: a stage of minutes under nohup or a Prefect worker shows where it is while it runs."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(progress, "MIN_SECONDS_BETWEEN_LINES", 0.0)
    with progress_bar("rl training steps", total=4) as advance:
        assert capsys.readouterr().err == "rl training steps: started, 4 to do\n"
        advance(1)
        assert capsys.readouterr().err.startswith("rl training steps: 1/4 (25%), ")
        advance(3)
    assert capsys.readouterr().err.startswith("rl training steps: 4/4 (100%), ")


def test_a_resumed_bar_counts_only_this_runs_work():
    """RL resumed at step 4 of 8, each step 60 s: the restored steps are where the bar starts, not 4 steps
    done in its first second; its rate and ETA are this run's."""
    printed, clock = [], FakeClock()
    bar = ProgressLines("rl training steps", 8, lambda text, **_: printed.append(text), clock, done=4)
    for completed in range(5, 9):
        clock.now += 60.0
        bar.advance(completed)
    assert printed == [
        "rl training steps: 4 of 8 done before, 4 to do",
        "rl training steps: 5/8 (62%), 0.0167/s, elapsed 1:00, eta 3:00",
        "rl training steps: 6/8 (75%), 0.0167/s, elapsed 2:00, eta 2:00",
        "rl training steps: 7/8 (88%), 0.0167/s, elapsed 3:00, eta 1:00",
        "rl training steps: 8/8 (100%), 0.0167/s, elapsed 4:00",
    ]


def test_progress_bar_starts_a_resumed_run_where_it_was(capsys, monkeypatch):
    """The helper itself: the log's start line, and the Prefect observer told the restored count before any step,
    so the UI's progress does not fall back to 0."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    seen = []
    monkeypatch.setattr(progress, "OBSERVERS", [lambda *args: seen.append(args)])
    with progress_bar("rl training steps", total=8, done=4) as advance:
        assert capsys.readouterr().err == "rl training steps: 4 of 8 done before, 4 to do\n"
        assert seen == [("rl training steps", 4, 8)]
        advance(1)
    assert seen[-1] == ("rl training steps", 5, 8)
