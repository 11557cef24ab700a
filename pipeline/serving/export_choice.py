"""Which trained checkpoint `export` ships: the one with the best validation score (issue 28).

Every training stage scores the model it starts from and the model it trains on the same validation
targets, each in its own answer format (pipeline/training/validation.py), and records the trained
model's score with its checkpoint. The newest checkpoint of each training stage (cpt, sft, rl) is a
candidate; the one with the highest mean wins, ties going to the later stage (the one the pipeline
exists to produce). The choice is made on the validation pool only: the eval pool, which the final
table reports, never decides anything.

What the choice says, for the stage's summary, the model card and the Prefect artifact: the winner and
its score, the runner-up and its score, the margin as a paired difference on the targets both scored
with its interval, and the base model's score (CPT's "before"), so a pipeline whose best model is
below its base says so. Without validation scores (`validation.max_queries: 0`, or checkpoints made
before the project measured them) the newest checkpoint of the last stage that ran is shipped, and
the choice says why.
"""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.evaluation.intervals import Interval, bootstrap_mean, paired_by_key
from pipeline.training.validation import target_scores

# The training stages, last first: the fallback order, and the tie-break (the later stage wins a tie).
TRAINING_STAGES = ("rl", "sft", "cpt")


@dataclass(frozen=True)
class Candidate:
    checkpoint_id: str
    stage: str
    path: Path
    base_model: str
    score: float | None  # validation score, 0-100

    @property
    def run_dir(self) -> Path:
        return self.path.parent


@dataclass(frozen=True)
class ExportChoice:
    chosen: Candidate
    runner_up: Candidate | None
    margin: Interval | None  # chosen - runner-up, paired over their shared validation targets
    base_score: float | None
    reason: str  # how the choice was made, in words

    def words(self) -> str:
        """`sft (validation 52.1) over cpt (49.8): +2.3 [-1.0, +5.6], no measurable change; base 44.0`."""
        if self.chosen.score is None:
            return self.reason
        text = f"{self.chosen.stage} (validation score {self.chosen.score:.1f})"
        if self.runner_up is not None and self.runner_up.score is not None and self.margin is not None:
            verdict = "a measurable margin" if self.margin.measurable else "no measurable margin"
            text += (
                f" over the runner-up {self.runner_up.stage} ({self.runner_up.score:.1f}): "
                f"{self.margin.text(signed=True)}, {verdict}"
            )
        if self.base_score is not None:
            relation = "above" if self.chosen.score > self.base_score else "NOT above"
            text += f"; {relation} the base model's {self.base_score:.1f}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen.checkpoint_id,
            "chosen_stage": self.chosen.stage,
            "chosen_score": self.chosen.score,
            "runner_up": self.runner_up.checkpoint_id if self.runner_up else None,
            "runner_up_stage": self.runner_up.stage if self.runner_up else None,
            "runner_up_score": self.runner_up.score if self.runner_up else None,
            "margin": self.margin.as_dict() if self.margin else None,
            "base_score": self.base_score,
            "reason": self.reason,
        }


def _newest(store, stage: str) -> Candidate | None:
    rows = store.rows(
        "SELECT checkpoint_id, stage, path, base_model, metrics FROM checkpoints WHERE stage = ? "
        "ORDER BY created_at DESC, checkpoint_id",
        [stage],
    )
    for row in rows:
        path = Path(row["path"])
        if (path / "config.json").is_file():
            metrics = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else (row["metrics"] or {})
            return Candidate(row["checkpoint_id"], stage, path, row["base_model"] or "", metrics.get("val_score_after"))
    return None


def _base_score(candidates: list[Candidate]) -> float | None:
    """The base model's validation score: CPT's "before" (the base, asked in CPT's format)."""
    cpt = next((c for c in candidates if c.stage == "cpt"), None)
    if cpt is None:
        return None
    return bootstrap_mean(list(target_scores(cpt.run_dir, "before").values())).mean


def choose(store) -> ExportChoice | None:
    """The checkpoint to ship, or None when no training stage registered one."""
    candidates = [c for c in (_newest(store, stage) for stage in TRAINING_STAGES) if c is not None]
    if not candidates:
        return None
    scored = [c for c in candidates if c.score is not None]
    if not scored:
        return ExportChoice(
            candidates[0],
            None,
            None,
            None,
            f"{candidates[0].stage}, the last training stage that ran: no checkpoint has a validation "
            "score (validation.max_queries is 0, or the checkpoints predate it)",
        )
    # Highest score first; among equals the later stage (TRAINING_STAGES is last first, and sorted() is stable).
    ranked = sorted(scored, key=lambda c: -c.score)  # type: ignore[operator]  # scored: not None
    chosen, runner_up = ranked[0], (ranked[1] if len(ranked) > 1 else None)
    margin = None
    if runner_up is not None:
        margin = paired_by_key(target_scores(chosen.run_dir), target_scores(runner_up.run_dir))
    return ExportChoice(chosen, runner_up, margin, _base_score(candidates), "the best validation score")
