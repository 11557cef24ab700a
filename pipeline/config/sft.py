"""Configuration of rejection-sampled SFT (SPEC.md, Stage 2; issue 10).

Grouped as TRL groups its configs: sampling (queries, generators), judging and selection, then
training data and held-out evaluation; optimisation and checkpoints come from TrainingSettings, with
SFT's own defaults. The Trainer settings the shared path fixes itself (pipeline/training/trainer.py):
a cosine schedule, two checkpoints kept, logging every 1% of the steps, evaluation at step 0 and at
the end only.
"""

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import Section
from pipeline.config.llm import EndpointConfig
from pipeline.config.training import TrainingSettings


class GeneratorConfig(Section):
    kind: Literal["endpoint", "retrieval"] = Field(
        default="endpoint",
        description="`endpoint`: a model behind `endpoint` (any OpenAI-compatible server, or a local transformers "
        "model, the CPT checkpoint by default) writes `<think>...</think>` then the observation. `retrieval`: the "
        "nearest-neighbour baseline, the observation of the most similar (action, recent history) of the cpt "
        "pool; a real but weak world model, reported as one.",
    )
    samples: int = Field(
        default=3, ge=1, le=16, description="Candidates this generator writes per query (paper: K=3 in all)."
    )
    endpoint: EndpointConfig = Field(
        default_factory=lambda: EndpointConfig(max_tokens=512),
        description="kind `endpoint`: where the model is (ignored by `retrieval`). 512 tokens hold a thinking "
        "block and a typical observation.",
    )
    thinking_budget: int | None = Field(
        default=96,
        ge=1,
        description="kind `endpoint` on the transformers backend: budget forcing (s1, Muennighoff et al. 2025). The "
        "answer is opened with `<think>`, the model thinks for at most this many tokens (or until it closes the "
        "block), the block is closed for it and it writes the observation after its own thinking, within "
        "`endpoint.max_tokens`. A small local model (the CPT checkpoint) then always answers in the thinking "
        "format, and its prediction follows from its thinking. 96 tokens hold the prompt's one to three "
        "sentences. None: the model writes freely (and must open and close the block itself). Ignored by the "
        "openai backend, whose reasoning models write their own thinking.",
    )
    rationale: bool = Field(
        default=False,
        description="kind `endpoint`: observation first, thinking second (pipeline/sft/rationale.py). The model "
        "predicts the observation as CPT prompts it, then, in a second request, writes the thinking that explains "
        "its own prediction (at most `thinking_budget` tokens, 96 when None; no budget forcing); the candidate is "
        "that thinking then that observation. For a small local generator, which loses the observation when it "
        "thinks first (the demo's 135M CPT checkpoint kept 1 query of 10 so, 4 of 10 this way); a reasoning "
        "model behind an endpoint thinks first (false).",
    )
    history_turns: int = Field(
        default=2,
        ge=0,
        description="kind `retrieval`: earlier turns whose text joins the action in the similarity key. The "
        "action decides most of an observation; one or two turns of context tell `cat x` after an edit from "
        "`cat x` before it, while more dilute the action's words.",
    )


class JudgeConfig(Section):
    kind: Literal["llm", "semantic"] = Field(
        default="semantic",
        description="`llm`: a judge model scores each candidate on SPEC's five criteria (1-5) with the domain's "
        "rubric (data/rubrics/), answering a JSON schema, then compares the competing candidates pairwise. "
        "`semantic`: the offline similarity judge (pipeline/rewards/semantic.py: agreement of what the observation "
        "adds to the action, its format and MiniLM cosine; per-leaf value agreement for JSON), mapped to 1 + 4 x "
        "similarity: not a five-criteria judge, and no pairwise step (comparing two similarities restates the "
        "scores). Default semantic, so the stage runs with no endpoint or key.",
    )
    endpoint: EndpointConfig = Field(
        default_factory=lambda: EndpointConfig(temperature=0.0, max_tokens=512),
        description="kind `llm`: the judge model. Temperature 0: a judgement should not depend on a draw.",
    )
    history_turns: int = Field(
        default=2,
        ge=0,
        description="Earlier turns shown to the judge before the action, for the consistency criterion; the "
        "reference carries the rest. More costs tokens on every judgement.",
    )


class SFTConfig(TrainingSettings):
    # --- sampling -------------------------------------------------------------------------------
    generators: list[GeneratorConfig] = Field(
        default_factory=lambda: [GeneratorConfig(kind="endpoint", samples=3)],
        min_length=1,
        description="Who writes the candidates; K per query is the sum of their `samples` (paper: 3). Default: "
        "the CPT checkpoint through the local transformers backend; production points an `endpoint` at a "
        "general reasoning model (production.yaml).",
    )
    max_queries: int | None = Field(
        default=None,
        ge=1,
        description="Queries sampled (a seeded choice among the sft pool's target turns, the same at every run); "
        "None: all of them. A budget for the demo and for trying a new endpoint. Targets that cannot fit "
        "`max_length` even with the shortest system template and no history are passed over before any "
        "candidate is generated for them (counted: `queries_unfittable`).",
    )
    max_history_chars: int = Field(
        default=24_000,
        ge=0,
        description="History kept in a query: the most recent whole turns whose actions and observations fit in "
        "this many characters (about 8k tokens for a real tokenizer). Older turns are left out of the generator's "
        "prompt and the training sample alike, so both see the same history.",
    )
    batch_queries: int = Field(
        default=32,
        ge=1,
        description="Queries generated, judged, selected and committed together. A killed run loses at most the "
        "batch in progress (and its answers are in the LLM cache, so they are not asked again).",
    )
    # --- judging and selection ------------------------------------------------------------------
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="Who scores the candidates against the real observation."
    )
    min_score: float = Field(
        default=3.0,
        ge=0,
        le=5,
        description="A query whose winning candidate scores below this (the mean of the five 1-5 criteria, or the "
        "similarity judge's 1 + 4 x similarity) is discarded. 3 is the scale's midpoint, 'acceptable': below it "
        "the judge found the prediction more wrong than right, and the thinking that led there is not worth "
        "imitating. On the similarity judge it is RWML's rule with threshold 0.5: 1 - cos < 0.5.",
    )
    min_content_agreement: float | None = Field(
        default=0.5,
        ge=0,
        le=1,
        description="The thinking check with the similarity judge (issue 17, item 7): a sample trains on the "
        "winner's thinking then the real observation, so the thinking must lead to that observation. A candidate "
        "competes only when its own prediction agrees with the real observation on deterministic content at least "
        "this much (pipeline/rewards/semantic.py `deterministic_agreement`: F1 of the tokens the action does not "
        "hold, scaled by the order of those it holds, the leaf-value agreement for JSON; an empty reference agrees "
        "only with an empty prediction); a "
        "query with none is discarded as `thinking_inconsistent`. 0.5: more of the environment's own tokens right "
        "than wrong; a listing with one name of three wrong (0.67) passes, a byte count off by one (0) does not. "
        "None: off.",
    )
    min_factuality: float | None = Field(
        default=3.0,
        ge=1,
        le=5,
        description="The thinking check with the `llm` judge: a candidate competes only when the judge's factuality "
        "criterion (1-5; the rubric's standard for deterministic content, which must match) is at least this; "
        "otherwise as `min_content_agreement`. 3, the scale's midpoint: below it the judge found the prediction's "
        "facts more wrong than right. None: off.",
    )
    # --- training: data -------------------------------------------------------------------------
    base_model: str | None = Field(
        default=None,
        description="Model SFT trains from and the transformers generator runs: None is the CPT checkpoint "
        "registered in `checkpoints` (the latest); any HF name or path otherwise.",
    )
    max_length: int = Field(
        default=2048,
        ge=64,
        description="Longest training sequence, and the length of a packed row. A sample longer than this drops its "
        "oldest history turns (counted); one whose system prompt, action and target alone do not fit is skipped "
        "(counted). May be shorter than `cpt.max_length`: the held-out CE is still measured on CPT's windows, in "
        "rows of their own length.",
    )
    label_history: bool = Field(
        default=True,
        description="Direct format only (`answers.thinking: false`): the observations of a sample's kept history are "
        "labels too, not only its target (pipeline/sft/samples.py). Each is a real observation in the format the "
        "model answers in; a sample is mostly prompt, so the target alone labels a small share of the tokens a step "
        "pays for (the demo: 1,226 labels in 25,738 tokens). An observation can then be a label in several samples "
        "of its trajectory (its own, and as history of the next ones). Ignored in the thinking format, whose history "
        "has no thinking.",
    )
    # --- training: optimisation and checkpoints (TrainingSettings, SFT's defaults) ----------------
    learning_rate: float = Field(
        default=1e-5,
        gt=0,
        description="Peak learning rate (cosine decay): SFT refines a CPT model on a few thousand samples, so an "
        "order of magnitude below CPT's.",
    )
    max_steps: int = Field(default=100, ge=1, description="Optimizer steps.")
    seed: int = Field(default=0, description="Seed of the query choice, the template draw and training.")
    save_steps: int = Field(default=25, ge=1, description="Checkpoint every this many steps (resume point).")
    output_dir: Path | None = Field(
        default=None, description="Where the checkpoint goes; None: `<workspace>/runs/sft/<fingerprint>`."
    )

    @model_validator(mode="after")
    def _llm_judge_has_a_model(self) -> "SFTConfig":
        if (
            self.judge.kind == "llm"
            and self.judge.endpoint.backend == "transformers"
            and self.judge.endpoint.model is None
        ):
            raise ValueError(
                "judge: an `llm` judge on the transformers backend needs `endpoint.model` (a judge is not the CPT checkpoint)"
            )
        return self

    @property
    def candidates_per_query(self) -> int:
        return sum(generator.samples for generator in self.generators)

    @property
    def min_agreement(self) -> float | None:
        """The thinking check's threshold on the configured judge's measure of agreement."""
        return self.min_factuality if self.judge.kind == "llm" else self.min_content_agreement
