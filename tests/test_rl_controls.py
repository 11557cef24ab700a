"""Control instructions scored by the rule of each kind (issue 17, item 4): what obeys and what does not.

The reference is what the environment really returned, without the fault; a copy of it must never count
as obeying, and a fault marker the reference already shows must not either."""

import json

import pytest

from pipeline.prompts.answer_format import RL_DIRECT, RL_THINKING
from pipeline.rl.controls import KINDS, heldout_control, obeys
from pipeline.rl.heldout import heldout_control_following
from pipeline.sft.queries import Query
from pipeline.store.schema import SystemPrompt

BOOK = '{"book_id": "B17", "title": "Dune", "copies": 3}'
LISTING = "a.txt\nb.txt\nc.txt\nd.txt\ne.txt\nf.txt"
BATCH = '{"deleted": ["a.txt", "b.txt", "c.txt"]}'

# (kind, prediction, reference, obeys, why)
CASES = [
    (
        "intermittent_api_error",
        '{"error": {"code": 503, "message": "Service Unavailable, retry later"}}',
        BOOK,
        True,
        "a JSON tool's transient error",
    ),
    (
        "intermittent_api_error",
        "curl: (28) Operation timed out after 30001 milliseconds",
        "<html>ok</html>",
        True,
        "a terminal's timeout",
    ),
    (
        "intermittent_api_error",
        "ssh: connect to host db port 22: Connection refused",
        "Welcome to db",
        True,
        "a refused connection",
    ),
    ("intermittent_api_error", BOOK, BOOK, False, "the fault-free observation copied"),
    (
        "intermittent_api_error",
        '{"book_id": "B17", "title": "Dune", "copies": 2}',
        BOOK,
        False,
        "a normal result, slightly off",
    ),
    (
        "intermittent_api_error",
        '{"error": "book not found"}',
        BOOK,
        False,
        "a permanent error is not a transient fault",
    ),
    ("intermittent_api_error", "", BOOK, False, "nothing at all"),
    (
        "paginated_response",
        '{"items": ["a.txt", "b.txt"], "next_cursor": "c2"}',
        '{"items": ["a.txt", "b.txt", "c.txt"]}',
        True,
        "a first page with a cursor",
    ),
    ("paginated_response", "a.txt\nb.txt\n--More--(33%)", LISTING, True, "a pager's prompt"),
    ("paginated_response", "a.txt\nb.txt\n... 4 more", LISTING, True, "a truncation notice with a count"),
    ("paginated_response", "a.txt\nb.txt", LISTING, False, "a short listing without a marker is just wrong"),
    ("paginated_response", LISTING, LISTING, False, "the whole result"),
    (
        "incomplete_intermediate_result",
        '{"job_id": "j-41", "status": "running"}',
        '{"status": "done", "rows": 42}',
        True,
        "a job to poll",
    ),
    (
        "incomplete_intermediate_result",
        "Downloading numpy (14.2 MB)... 37%",
        "Successfully installed numpy-2.1.0",
        True,
        "progress so far",
    ),
    (
        "incomplete_intermediate_result",
        '{"status": "running", "rows": 42}',
        '{"status": "running", "rows": 42}',
        False,
        "the reference copied, though it says running",
    ),
    (
        "incomplete_intermediate_result",
        '{"status": "running", "rows": 41}',
        '{"status": "running", "rows": 42}',
        False,
        "no more in progress than the reference shows",
    ),
    (
        "partial_batch_failure",
        '{"deleted": ["a.txt", "b.txt"], "errors": [{"file": "c.txt", "error": "permission denied"}]}',
        BATCH,
        True,
        "part done, part failed with its error",
    ),
    (
        "partial_batch_failure",
        "rm: cannot remove 'c.txt': Permission denied",
        "",
        False,
        "all failed: no part succeeded",
    ),
    ("partial_batch_failure", BATCH, BATCH, False, "all succeeded"),
]


@pytest.mark.parametrize(("kind", "prediction", "reference", "expected", "why"), CASES, ids=[c[4] for c in CASES])
def test_obeys(kind, prediction, reference, expected, why):
    assert obeys(kind, prediction, reference) is expected, why


def test_every_kind_has_a_rule_and_the_held_out_set_asks_each_in_turn():
    assert {kind for kind, *_ in CASES} == set(KINDS)
    assert [heldout_control(i) for i in range(len(KINDS) * 2)] == list(KINDS) * 2
    with pytest.raises(ValueError, match="unknown control"):
        obeys("earthquake", "x", "y")


def test_heldout_instruction_following_rate(tmp_path):
    queries = [Query(f"t{i}", 0, "terminal", SystemPrompt(), (), "cat notes.txt", "hello", 0) for i in range(5)]
    texts = [
        "<think>\nfault\n</think>\n\ncat: notes.txt: Connection timed out",  # intermittent_api_error: obeys
        "<think>\npage\n</think>\n\nhello",  # paginated_response: the fault-free copy
        "no thinking block: in progress",  # incomplete_intermediate_result: unparsed, not followed
        None,  # partial_batch_failure: the generation failed
        "<think>\nfault\n</think>\n\n503 Service Unavailable, retry",  # intermittent_api_error again: obeys
    ]
    (tmp_path / "heldout_after_control_predictions.json").write_text(
        json.dumps([{"query_id": q.query_id, "text": t, "error": None} for q, t in zip(queries, texts)])
    )
    measured = heldout_control_following(queries, tmp_path, "after_control", RL_THINKING)
    assert measured == {
        "queries": 5,
        "following_rate": 0.4,
        "by_kind": {
            "incomplete_intermediate_result": 0.0,
            "intermittent_api_error": 1.0,
            "paginated_response": 0.0,
            "partial_batch_failure": 0.0,
        },
    }
    assert heldout_control_following([], tmp_path, "none", RL_THINKING)["following_rate"] is None
    # Read in the direct format, the same answers: a thinking block is not the observation asked for.
    direct = heldout_control_following(queries, tmp_path, "after_control", RL_DIRECT)
    assert direct["by_kind"]["intermittent_api_error"] == 0.0
