"""Configuration of `simulacra evaluate` (issue 12; SPEC.md, "Evaluation"): which queries, how each model
is asked, which judge scores the answers, and the judge-free metrics beside it."""

from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import Section
from pipeline.config.llm import EndpointConfig
from pipeline.config.sft import JudgeConfig

CHECKPOINT_PLACEHOLDER = "{checkpoint}"


class BenchmarkConfig(Section):
    """How `simulacra evaluate --data FILE...` reads a benchmark (issue 18; pipeline/evaluation/benchmark.py)."""

    target_field: str = Field(
        default="benchmark_target",
        min_length=1,
        description="Turn metadata field that marks a target turn (`true`): those turns are scored exactly as given, "
        "never re-chosen. AgentWorldBench rows are marked by their `turn_idx`. A trajectory that marks none has "
        "every turn scored.",
    )
    max_history_chars: int | None = Field(
        default=None,
        ge=0,
        description="History of a benchmark item: None (default) gives every earlier turn, as AgentWorldBench gives "
        "the whole history; a number keeps the most recent whole turns within that many characters (each item "
        "reports the turns it left out).",
    )
    max_items_per_path: int | None = Field(
        default=None,
        ge=1,
        description="Items scored per `--data` path (a file, or a folder's files together): a seeded choice "
        "(`evaluate.seed`), the same at every run, a larger budget a superset, so every path keeps its share of "
        "the eval set; None (default): every item. A budget for slow machines and large benchmark files.",
    )


class EvaluateConfig(Section):
    # --- the eval set ---------------------------------------------------------------------------
    max_queries: int | None = Field(
        default=None,
        ge=1,
        description="Target turns of the eval pool evaluated per model (a seeded choice, the same at every run, "
        "a larger budget a superset); None: all of them (the split's first, last and up to three middle turns "
        "per trajectory). A budget for the demo and for expensive judges.",
    )
    seed: int = Field(default=0, description="Seed of the query choice under `max_queries`.")
    max_history_chars: int = Field(
        default=24_000,
        ge=0,
        description="History given with a query: the most recent whole turns within this many characters, as SFT "
        "builds its queries (sft.max_history_chars), so a model is asked in the shape it was trained on.",
    )
    checkpoints: Literal["newest", "shipped"] = Field(
        default="newest",
        description="Which trained models a run evaluates beside the base model (without `--checkpoint`). newest: "
        "the newest checkpoint of each training stage (cpt, sft, rl), each compared with the one it started from. "
        "shipped: only the checkpoint `export` ships, the best validation score (pipeline/serving/export_choice.py), "
        "compared with base: one pass over the eval set per model, so the demo's 2 cores evaluate 2 models, not 4 "
        "(each stage's own before/after is measured on the validation pool either way).",
    )
    benchmark: BenchmarkConfig = Field(
        default_factory=BenchmarkConfig,
        description="`--data` files read as a benchmark: which turns are targets, how much history an item gets.",
    )
    # --- how each model is asked ----------------------------------------------------------------
    predictor: EndpointConfig = Field(
        default_factory=lambda: EndpointConfig(temperature=0.0, max_tokens=1024),
        description="How predictions are generated. `transformers` (default): each checkpoint folder is loaded "
        "locally (`model` is ignored). `openai`: an OpenAI-compatible server (e.g. `vllm serve PATH`) serving the "
        "checkpoints; `model` is the served name, where `{checkpoint}` stands for the checkpoint's folder (vLLM "
        "serves a folder under its path by default). Temperature 0: greedy, so a score does not depend on a draw.",
    )
    teacher_forcing: bool = Field(
        default=True,
        description="Measure the cross-entropy of each real observation under teacher forcing (needs the "
        "checkpoint's folder on this machine; skipped for a model known only by its endpoint).",
    )
    max_length: int = Field(
        default=4096,
        ge=64,
        description="Longest teacher-forced sequence: oldest history turns are dropped until it fits, as in SFT "
        "samples; a query whose prompt and observation alone do not fit has no cross-entropy.",
    )
    batch_queries: int = Field(
        default=16,
        ge=1,
        description="Queries judged, measured and committed together: a killed run loses at most this many rows "
        "(their predictions and LLM judgements are in the LLM cache and are not asked again).",
    )
    # --- scoring --------------------------------------------------------------------------------
    exclude_empty_generations: bool = Field(
        default=False,
        description="An answer of nothing but whitespace is counted (`empty`) and left out of every mean instead "
        "of being judged, as AgentWorldBench drops empty generations (eval.py: `if not gen`). Off by default: "
        "`mkdir x` prints nothing, so an empty answer can be right; the agentworldbench preset turns it on.",
    )
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig,
        description="Who scores each prediction against the real observation: `llm`, the five criteria (1-5) "
        "with the domain's rubric (as SFT's judge); `semantic` (default), the offline similarity judge mapped "
        "onto 1-5, which has no criteria and is labelled so in the table.",
    )
    judge_prompt: Literal["rubric", "agentworldbench"] = Field(
        default="rubric",
        description="With an `llm` judge: `rubric`, SFT's pointwise prompt with the domain's rubric, answered as a "
        "JSON schema; `agentworldbench`, the per-domain prompt of data/prompts/eval_judge_tagged.md (the domain's "
        "rubric classifies the content first), free reasoning, then the verdict as JSON inside <final_evaluation> "
        "tags, as AgentWorldBench's judge answers. Scores are comparable only under one named judge and prompt.",
    )
    semantic_match_threshold: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Semantic match (RWML's reward, SPEC.md): 1 - similarity below this. 0.5 is the rule SFT's "
        "min_score of 3 applies on the similarity judge, so the two agree on what counts as a match.",
    )
    baseline_history_turns: int | None = Field(
        default=2,
        ge=0,
        description="The retrieval baseline row (SFT's nearest-neighbour generator over the cpt pool) with this "
        "many history turns in its key (sft's default); None leaves it out. A world model that does not beat "
        "copying the nearest known observation has not learnt the environment.",
    )

    @model_validator(mode="after")
    def _llm_judge_has_a_model(self) -> "EvaluateConfig":
        if (
            self.judge.kind == "llm"
            and self.judge.endpoint.backend == "transformers"
            and self.judge.endpoint.model is None
        ):
            raise ValueError(
                "judge: an `llm` judge on the transformers backend needs `endpoint.model` (a judge is not the evaluated model)"
            )
        return self
