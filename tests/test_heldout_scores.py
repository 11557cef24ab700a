"""The held-out judge scores of SFT and RL runs score an empty observation like any other (issue 17,
item 16): `mkdir x` prints nothing, so an empty answer to it is right and must not score 0.

Real parts: the offline similarity judge (MiniLM), the predictions files the training side writes.
"""

import json

import pytest

from pipeline.rl.heldout import heldout_score
from pipeline.sft.judging import SemanticJudge
from pipeline.sft.queries import Query
from pipeline.store.schema import SystemPrompt
from stages.sft import _heldout_score


def _query(action: str, reference: str) -> Query:
    return Query("t1", 0, "terminal", SystemPrompt(task_description="a shell"), (), action, reference, 0)


QUERIES = [_query("mkdir x", ""), _query("echo hi", "hi\n")]


@pytest.fixture(scope="module")
def judge():
    return SemanticJudge()


@pytest.mark.parametrize(
    "case, predictions, expected_usable, mkdir_scores_full",
    [
        # The model before SFT answers in the non-thinking format: its empty answer is the observation.
        ("non-thinking, empty and right", [{"text": "", "thinking": False}, {"text": "hi\n", "thinking": False}], 2, True),
        # After SFT: the observation after </think> is empty, and right.
        ("thinking, empty observation", [{"text": "<think>\nmkdir prints nothing\n</think>\n\n", "thinking": True},
                                         {"text": "<think>\nechoes\n</think>\n\nhi\n", "thinking": True}], 2, True),
        # No closed <think> block: nothing to judge, 0.
        ("thinking, unparsed", [{"text": "", "thinking": True}, {"text": "<think>\nechoes\n</think>\n\nhi\n", "thinking": True}], 1, False),
    ],
)
def test_sft_heldout_score_judges_an_empty_observation(judge, case, predictions, expected_usable, mkdir_scores_full):
    result = _heldout_score(QUERIES, [{"query_id": q.query_id, "error": None, **p} for q, p in zip(QUERIES, predictions)], judge)
    assert result["usable_predictions"] == expected_usable, case
    # The echo answer is exact (similarity 1: 5 on the 1-5 scale); the mkdir answer adds 5 when judged, 0 when not.
    assert result["mean_score"] == pytest.approx((5.0 + (5.0 if mkdir_scores_full else 0.0)) / 2, abs=1e-3), case


def test_rl_heldout_score_judges_an_empty_observation(judge, tmp_path):
    texts = ["<think>\nmkdir prints nothing\n</think>\n\n", "<think>\nechoes\n</think>\n\nhi\n"]
    predictions = [{"query_id": q.query_id, "text": text, "error": None} for q, text in zip(QUERIES, texts)]
    (tmp_path / "heldout_after_predictions.json").write_text(json.dumps(predictions))
    result = heldout_score(QUERIES, tmp_path, "after", judge)
    assert result["usable_predictions"] == 2 and result["mean_score"] == pytest.approx(5.0, abs=1e-3)
