"""Instruction-following before and after RL, where RL trains control instructions (`rl.control_fraction`
> 0): the validation targets (pipeline/training/validation.py) asked with a control instruction each (the
four kinds in turn), greedily in RL's template and the run's answer format, and scored by whether the
prediction obeys it (pipeline/rl/controls.py `obeys`): the instruction-following rate.

The predictions are made where training runs, with a scratch answer cache in the run's folder
(`heldout_cache.duckdb`, never the store, so a GPU worker can make them). Each set of predictions is
written once, so a resumed run does not generate again. (The plain score before and after is the
validation score every training stage reports.)
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.prompts.answer_format import AnswerFormat
from pipeline.prompts.rl import rl_messages
from pipeline.rl.controls import CONTROLS, heldout_control, obeys
from pipeline.sft.queries import Query
from pipeline.store.atomic_files import write_text_atomic
from pipeline.training.runs import HELDOUT_CACHE


def _predictions_path(output_dir: Path, name: str) -> Path:
    return output_dir / f"heldout_{name}_predictions.json"


def heldout_predictions(
    queries: Sequence[Query],
    model_ref: str,
    max_tokens: int,
    output_dir: Path,
    sets: Sequence[tuple[str, bool]],
    fmt: AnswerFormat,
) -> None:
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
    asked = {
        name: [
            ChatRequest(
                tuple(
                    rl_messages(
                        q.domain,
                        q.system,
                        q.history,
                        q.action,
                        CONTROLS[heldout_control(i)] if controlled else None,
                        fmt.thinking,
                    )
                )
            )
            for i, q in enumerate(queries)
        ]
        for name, controlled in missing
    }
    answers = []
    if queries:
        endpoint = EndpointConfig(backend="transformers", model=str(model_ref), temperature=0.0, max_tokens=max_tokens)
        with Store(output_dir / HELDOUT_CACHE) as scratch:
            client = open_client(endpoint, scratch, "rl.heldout." + "+".join(name for name, _ in missing))
            answers = client.complete_sync([request for requests in asked.values() for request in requests])
    for position, name in enumerate(asked):
        mine = answers[position * len(queries) : (position + 1) * len(queries)]
        predictions = [{"query_id": q.query_id, "text": a.text, "error": a.error} for q, a in zip(queries, mine)]
        write_text_atomic(_predictions_path(output_dir, name), json.dumps(predictions, indent=2) + "\n")


def heldout_control_following(
    queries: Sequence[Query], output_dir: Path, name: str, fmt: AnswerFormat
) -> dict[str, Any]:
    """The share of the controlled predictions kept under `name` that obey their instruction, and per kind."""
    if not queries:
        return {"queries": 0, "following_rate": None, "by_kind": {}}
    predictions = json.loads(_predictions_path(output_dir, name).read_text())
    by_kind: dict[str, list[bool]] = {}
    for index, (query, prediction) in enumerate(zip(queries, predictions)):
        parsed = fmt.parse(prediction["text"])
        kind = heldout_control(index)
        by_kind.setdefault(kind, []).append(parsed.ok and obeys(kind, parsed.prediction, query.reference))  # type: ignore[arg-type]  # ok: a prediction
    followed = [ok for oks in by_kind.values() for ok in oks]
    return {
        "queries": len(followed),
        "following_rate": sum(followed) / len(followed),
        "by_kind": {kind: sum(oks) / len(oks) for kind, oks in sorted(by_kind.items())},
    }
