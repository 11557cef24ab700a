"""Configuration of `simulacra split`: disjoint training pools and target-turn selection."""

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from pipeline.config.base import Section

Pool = Literal["cpt", "sft", "rl", "val", "eval"]
# Slices of [0, 1) in this order: eval stays the last tenth whatever the training shares, so carving the
# validation pool out of the training side (issue 28) moved no eval trajectory.
POOLS: tuple[Pool, ...] = ("cpt", "sft", "rl", "val", "eval")
# A group field: the trajectory's `task`, or a dotted path into its `metadata` JSON.
GROUP_FIELD = re.compile(r"task|metadata(\.[A-Za-z0-9_-]+)+")


class PoolRatios(Section):
    cpt: float = Field(default=0.5, ge=0, description="Share of groups for continual pretraining.")
    sft: float = Field(default=0.2, ge=0, description="Share for rejection-sampled SFT.")
    rl: float = Field(default=0.15, ge=0, description="Share for GSPO RL (one target turn each).")
    val: float = Field(
        default=0.05,
        ge=0,
        description="Validation share, carved from the training side and never trained on: every training stage "
        "reports its score on it before and after, and `export` ships the checkpoint that scores best on it, so "
        "no choice is made on the eval pool, which only reports.",
    )
    eval: float = Field(default=0.1, ge=0, description="Held-out share, never trained on, never chosen by.")

    @model_validator(mode="after")
    def _sum_to_one(self) -> "PoolRatios":
        total = self.cpt + self.sft + self.rl + self.val + self.eval
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"pool ratios must sum to 1, got {total:.6f}")
        return self


class TargetSelection(Section):
    strategy: Literal["all", "one", "first_last_middle"] = Field(
        description="`all`: every kept turn; `one`: one seeded turn per trajectory; `first_last_middle`: "
        "the first, the last and up to `middle` seeded turns between them."
    )
    middle: int = Field(default=3, ge=0, description="Middle turns for `first_last_middle` (paper: 3).")


class SplitConfig(Section):
    ratios: PoolRatios = Field(
        default_factory=PoolRatios,
        description="Pool shares of groups (see `group_by`): whole groups are placed, so the shares of trajectories "
        "follow them only as far as group sizes even out.",
    )
    group_by: list[str] = Field(
        default_factory=lambda: ["metadata.task_id", "metadata.instance_id", "task"],
        min_length=1,
        description="Fields tried in order for a trajectory's group key; all trajectories of a group go to one pool, "
        "so runs of one task never sit on both sides of the eval line (issue 13: on the demo, trajectory-level "
        "placement left 102 of 212 eval targets verbatim in the cpt pool). `task` or `metadata.<dotted.path>`; the "
        "first non-empty one wins, and a trajectory with none is a group of its own. Defaults: tau-bench's "
        "`task_id` (its `task` is the simulated user's first message, new each trial), SWE-bench's `instance_id` "
        "(OpenHands and HF exports), else the task text (the same goal or issue gives the same text). Changing "
        "it reassigns every pool at once, like the salt.",
    )
    val_sources: list[str] = Field(
        default_factory=list,
        description="Ingest sources (their `name`) held out as a whole environment: no training pool holds any of "
        "their groups. Their groups in eval's slice of [0, 1) stay in eval; all their others go to val, whatever "
        "the ratios say, beside the other sources' val share (set `ratios.val` to 0 for a val pool of these sources "
        "alone). The validation score then measures what training does to an environment it never saw, and "
        "`export` ships by that. A group that holds a trajectory of one of these sources counts as theirs. A name "
        "with no kept trajectory is an error, not a silent no-op.",
    )
    salt: str = Field(
        default="simulacra-pools-v1",
        description="Mixed into the hash that places a group. Changing it reshuffles every pool, so it is "
        "fixed once a project starts; adding data never moves a trajectory.",
    )
    seed: int = Field(
        default=0,
        ge=0,
        lt=2**31,
        description="Seed for target-turn selection: a turn's rank is md5(seed:trajectory_id:turn_index), so the "
        "choice depends on the seed and the trajectory alone. Stored with each target (an INTEGER column).",
    )
    sft_targets: TargetSelection = Field(
        default_factory=lambda: TargetSelection(strategy="all"),
        description="Which turns of an SFT trajectory become queries.",
    )
    rl_targets: TargetSelection = Field(
        default_factory=lambda: TargetSelection(strategy="one"),
        description="RL uses exactly one turn per trajectory: samples expanded from one trajectory share "
        "prefixes and correlated rewards (the echo trap of SPEC.md).",
    )
    val_targets: TargetSelection = Field(
        default_factory=lambda: TargetSelection(strategy="first_last_middle", middle=3),
        description="Validation targets, chosen as the eval pool's are, so a validation score predicts an eval one.",
    )
    eval_targets: TargetSelection = Field(
        default_factory=lambda: TargetSelection(strategy="first_last_middle", middle=3),
        description="AgentWorldBench-style: the first, the last and up to three middle turns.",
    )

    @field_validator("val_sources")
    @classmethod
    def _distinct_sources(cls, names: list[str]) -> list[str]:
        blank = [name for name in names if not name.strip()]
        if blank:
            raise ValueError("a source name is blank")
        return sorted(set(names))

    @field_validator("group_by")
    @classmethod
    def _known_fields(cls, fields: list[str]) -> list[str]:
        for name in fields:
            if not GROUP_FIELD.fullmatch(name):
                raise ValueError(
                    f"group field {name!r}: expected `task` or `metadata.<key>[.<key>...]` (letters, digits, _ and -)"
                )
        return fields
