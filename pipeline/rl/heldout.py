"""The held-out judge score before and after RL: a fixed, seeded set of eval-pool queries, predicted
greedily in the RL template (no control instruction) and scored by the reward's judge; and, where
RL trains control instructions, the same queries asked with one each (the four kinds in turn), scored
by whether the prediction obeys it (pipeline/rl/controls.py `obeys`): the instruction-following rate.

As SFT's held-out score (stages/sft.py): the predictions are made where training runs, with a
scratch answer cache in the run's folder (`heldout_cache.duckdb`, never the store, so a GPU worker
can make them), and judged on the data side; the score is the SFT judge's pointwise score, the mean
of the five 1-5 criteria (or the similarity judge's 1 + 4 x similarity), a prediction without its
tags or a failed generation scoring 0. The two numbers of a run are on the same queries, template
and judge. Each set of predictions is written once, so a resumed run does not generate again.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.prompts.rl import rl_messages
from pipeline.rl.controls import CONTROLS, heldout_control, obeys
from pipeline.sft.candidates import parse_candidate
from pipeline.sft.queries import Query
from pipeline.store.atomic_files import write_text_atomic
from pipeline.training.runs import HELDOUT_CACHE


def _predictions_path(output_dir: Path, name: str) -> Path:
    return output_dir / f"heldout_{name}_predictions.json"


def heldout_predictions(queries: Sequence[Query], model_ref: str, max_tokens: int, output_dir: Path,
                        sets: Sequence[tuple[str, bool]]) -> None:
    """Greedy predictions of `queries` by `model_ref` (the transformers backend), kept in the run's folder,
    one file per set `(name, controlled)`; `controlled`: each query asked with a control instruction, the
    kinds in turn (`heldout_control`). The sets not yet written are asked together: one model load, one
    continuous batch (a decoding step of 6 rows costs about what one of 3 does on a CPU)."""
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import ChatRequest, open_client
    from pipeline.store.database import Store

    missing = [(name, controlled) for name, controlled in sets if not _predictions_path(output_dir, name).is_file()]
    if not missing:
        return
    asked = {name: [ChatRequest(tuple(rl_messages(q.domain, q.system, q.history, q.action,
                                                  CONTROLS[heldout_control(i)] if controlled else None)))
                    for i, q in enumerate(queries)]
             for name, controlled in missing}
    answers = []
    if queries:
        endpoint = EndpointConfig(backend="transformers", model=str(model_ref), temperature=0.0, max_tokens=max_tokens)
        with Store(output_dir / HELDOUT_CACHE) as scratch:
            client = open_client(endpoint, scratch, "rl.heldout." + "+".join(name for name, _ in missing))
            answers = client.complete_sync([request for requests in asked.values() for request in requests])
    for position, name in enumerate(asked):
        mine = answers[position * len(queries): (position + 1) * len(queries)]
        predictions = [{"query_id": q.query_id, "text": a.text, "error": a.error} for q, a in zip(queries, mine)]
        write_text_atomic(_predictions_path(output_dir, name), json.dumps(predictions, indent=2) + "\n")


def heldout_score(queries: Sequence[Query], output_dir: Path, name: str, judge) -> dict[str, Any]:
    """Mean judge score of the predictions `heldout_predictions` kept under `name`."""
    from pipeline.sft.judging import PointwiseItem

    if not queries:
        return {"queries": 0, "usable_predictions": 0, "mean_score": None}
    predictions = json.loads(_predictions_path(output_dir, name).read_text())
    parsed = [parse_candidate(prediction["text"]) for prediction in predictions]
    judged = [i for i, p in enumerate(parsed) if p.ok]
    verdicts = judge.pointwise([PointwiseItem(queries[i], parsed[i].prediction) for i in judged]) if judged else []
    scores = [0.0] * len(queries)
    for i, verdict in zip(judged, verdicts):
        scores[i] = verdict.score
    return {"queries": len(queries), "usable_predictions": len(judged), "mean_score": sum(scores) / len(scores)}


def heldout_control_following(queries: Sequence[Query], output_dir: Path, name: str) -> dict[str, Any]:
    """The share of the controlled predictions kept under `name` that obey their instruction, and per kind."""
    if not queries:
        return {"queries": 0, "following_rate": None, "by_kind": {}}
    predictions = json.loads(_predictions_path(output_dir, name).read_text())
    by_kind: dict[str, list[bool]] = {}
    for index, (query, prediction) in enumerate(zip(queries, predictions)):
        parsed = parse_candidate(prediction["text"])
        kind = heldout_control(index)
        by_kind.setdefault(kind, []).append(parsed.ok and obeys(kind, parsed.prediction, query.reference))
    followed = [ok for oks in by_kind.values() for ok in oks]
    return {"queries": len(followed), "following_rate": sum(followed) / len(followed),
            "by_kind": {kind: sum(oks) / len(oks) for kind, oks in sorted(by_kind.items())}}
