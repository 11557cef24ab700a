"""Configuration of GSPO reinforcement learning (SPEC.md, Stage 3; issue 11).

Grouped as TRL groups GRPOConfig: prompts, rewards, GSPO and generation, optimisation and
checkpoints, GPU workers, held-out evaluation. Not a `TrainingSettings` subclass: GRPO counts its
batch in completions (a multiple of the group size), not in tokens or rows of packed sequences.
"""

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from pipeline.config.base import Section
from pipeline.config.model import MixedPrecision
from pipeline.config.sandbox import SandboxConfig
from pipeline.config.sft import JudgeConfig


class RewardConfig(Section):
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig,
        description="The main reward. `llm`: the rubric reward, an LLM judge scores SPEC's five criteria 1-5 with "
        "the domain's rubric (the SFT judge's prompt, schema and validation), reward = mean x 5 in [5, 25]. "
        "`semantic`: the offline reward after RWML (no endpoint, no key), 25 x the offline judge's score in [0, 1] "
        "(pipeline/rewards/semantic.py), graded rather than RWML's all-or-nothing cut so that tied groups stay "
        "rare. Default semantic, so the stage runs offline; production.yaml sets `llm`. The same judge gives the "
        "held-out score.",
    )
    main_weight: float = Field(
        default=0.9,
        ge=0,
        description="Weight of the main (rubric or semantic) reward in the combined reward (SPEC: 0.9).",
    )
    rule_weight: float = Field(
        default=0.1,
        ge=0,
        description="Weight of the rule reward (sandboxed verifiers, 25 pass / 0 fail) in the combined reward (SPEC: "
        "0.1). A prompt whose turn has no verifier gets no rule term at all (TRL's None): every completion of a "
        "group shares the prompt, so the group's advantages are main_weight x the main reward's contrast alone "
        "(README, RL).",
    )
    aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        default="normalize_then_sum",
        description="TRL's multi_objective_aggregation, which decides what 9:1 means in a group. "
        "`normalize_then_sum` (default): each reward is standardised within its group, then weighted, so the "
        "advantage is 0.9 x the main reward's contrast + 0.1 x the rule's; a reward that ties in a group (common "
        "with coarse Likert scores) contributes no contrast and the other keeps its own weight, so a group whose "
        "main reward ties moves the policy a tenth as far as one where both agree. `sum_then_normalize` weights "
        "the raw rewards then standardises the sum: where the main reward ties, the rule's 0.1 x 25 is scaled "
        "back to the whole advantage ([1.5, -0.5, -0.5, -0.5]) and 9:1 holds only in groups where the main reward varies.",
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Limits of the verifier sandbox.")

    @model_validator(mode="after")
    def _weights(self) -> "RewardConfig":
        if self.main_weight + self.rule_weight <= 0:
            raise ValueError("main_weight and rule_weight are both 0: no reward would reach the policy")
        if (
            self.judge.kind == "llm"
            and self.judge.endpoint.backend == "transformers"
            and self.judge.endpoint.model is None
        ):
            raise ValueError("judge: an `llm` judge on the transformers backend needs `endpoint.model`")
        return self


class GPUWorkersConfig(Section):
    use_vllm: bool = Field(
        default=False,
        description="Generate the rollouts with vLLM (TRL's integration) instead of transformers' generate. "
        "Needs the `gpu` extra (vllm) and a CUDA GPU; off on CPU and in the demo.",
    )
    vllm_mode: Literal["colocate", "server"] = Field(
        default="colocate",
        description="`colocate`: vLLM runs inside each training process and shares its GPU (one node, no extra "
        "GPU, `vllm_gpu_memory_utilization` of its memory). `server`: a separate `trl vllm-serve` on GPUs of its "
        "own (README, RL: GPU workers), reached at `vllm_server_base_url`; training and generation then overlap.",
    )
    vllm_server_base_url: str | None = Field(
        default=None,
        description="server mode: the `trl vllm-serve` URL, e.g. http://gen-node:8000. None: TRL's default, port 8000 of this machine.",
    )
    vllm_gpu_memory_utilization: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="colocate mode: share of each GPU vLLM may take for weights and KV cache; the rest stays for "
        "training. 0.3 is TRL's default for colocation.",
    )
    vllm_tensor_parallel_size: int = Field(
        default=1, ge=1, description="colocate mode: GPUs one vLLM engine spans (a model too big for one GPU)."
    )
    gradient_checkpointing: bool = Field(
        default=False,
        description="Recompute activations in the backward pass: the memory of long completions for about a third "
        "more compute. Off by default (the tiny model and CPU need none); deploy configs turn it on for real models.",
    )
    liger_layer_kernels: bool = Field(
        default=False,
        description="Liger's fused RMSNorm / RoPE / SwiGLU kernels (TRL's use_liger_kernel; needs liger-kernel and "
        "CUDA). The loss itself never materialises the logits either way: TRL 1.16 computes per-token "
        "log-probabilities through its own tiled LM head (README, RL).",
    )


class RLConfig(Section):
    # --- prompts --------------------------------------------------------------------------------
    base_model: str | None = Field(
        default=None,
        description="Model RL starts from: None is the newest registered SFT checkpoint, else the CPT one, else "
        "`model.base` (or the workspace's tiny model); any HF name or path otherwise.",
    )
    max_prompts: int | None = Field(
        default=None,
        ge=1,
        description="Prompts trained on: a seeded choice among the rl pool's target turns (one per trajectory), "
        "the same at every run; None: all of them.",
    )
    max_history_chars: int = Field(
        default=24_000,
        ge=0,
        description="History in a prompt: the most recent whole turns whose actions and observations fit in this "
        "many characters, as in SFT, so the policy sees the context it was fine-tuned on.",
    )
    max_prompt_tokens: int | None = Field(
        default=None,
        ge=16,
        description="Leave out the prompts longer than this many tokens (in the policy's tokenizer and chat "
        "template), before the choice of `max_prompts`, and count them (`prompts_too_long`); as verl's "
        "`filter_overlong_prompts`. A GSPO step runs forward and backward over every completion's whole prompt, "
        "so its cost follows the longest prompts (on 2 CPU cores a step on a 1,600-token tool-call prompt took "
        "107 s, one on a 400-token game prompt 28 s). Never truncated: a cut system prompt would change the "
        "environment. None: every prompt.",
    )
    verifier_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="At least this share of the `max_prompts` prompts is taken from the targets that carry a "
        "verifier (the first of them in the seeded rank order; fewer when fewer exist), the rest in rank order as "
        "before. The rule reward (the 1 of 9:1) fires only on such prompts: where verifiers are rare among the "
        "prompts that fit (the demo's verified turns are mostly tool calls, too long for its prompts), a small "
        "seeded choice can hold none, and the mix would train one reward. 0: the plain seeded choice.",
    )
    control_fraction: float = Field(
        default=0.25,
        ge=0,
        le=1,
        description="Share of prompts that carry one of SPEC's four control instructions (intermittent API error, "
        "paginated response, incomplete intermediate result, partial batch failure) in their simulation "
        "instructions; the judge is told it. A quarter keeps faults a minority, as in a simulator used for policy "
        "RL, while every batch of a few prompts is likely to hold one.",
    )
    # --- rewards --------------------------------------------------------------------------------
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Rubric / semantic and rule rewards.")
    # --- GSPO and generation ---------------------------------------------------------------------
    num_generations: int = Field(
        default=8,
        ge=2,
        description="Group size: completions per prompt, whose rewards are normalised together (GRPO/GSPO need at "
        "least 2; 8 is a common choice and GSPO's).",
    )
    temperature: float = Field(
        default=1.0, gt=0, description="Sampling temperature of the rollouts: 1.0 samples the policy as it is."
    )
    max_completion_length: int = Field(
        default=512,
        ge=8,
        description="Most tokens of a completion: a thinking block and an observation. A completion cut there has "
        "no closing content and usually scores 0 (missing tags).",
    )
    beta: float = Field(
        default=0.0,
        ge=0,
        description="KL coefficient against the starting model. GSPO uses none (0.0, STACK.md), which also spares "
        "the reference model's memory and forward pass.",
    )
    epsilon: float = Field(
        default=3e-4,
        gt=0,
        description="Lower clipping range of the sequence-level ratio (GSPO paper: 3e-4; sequence ratios are "
        "geometric means of token ratios, so their range is far tighter than GRPO's 0.2).",
    )
    epsilon_high: float = Field(default=4e-4, gt=0, description="Upper clipping range (GSPO paper: 4e-4).")
    steps_per_generation: int = Field(
        default=4,
        ge=1,
        description="Micro-batches generated at once (TRL's steps_per_generation); divided by "
        "gradient_accumulation_steps, the optimizer steps each batch of rollouts feeds (GSPO paper: 4 mini-batches "
        "per rollout batch). Beyond the first, those steps are off-policy, which is where GSPO's sequence-level "
        "ratio matters at all (STACK.md).",
    )
    num_iterations: int = Field(default=1, ge=1, description="Passes over each rollout batch (GRPO's mu).")
    # --- optimisation and checkpoints ------------------------------------------------------------
    per_device_batch_size: int = Field(
        default=8,
        ge=1,
        description="Completions per device per micro-batch; times gradient_accumulation_steps and the process "
        "count it must be a multiple of num_generations (TRL).",
    )
    gradient_accumulation_steps: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    learning_rate: float = Field(
        default=1e-6,
        gt=0,
        description="Peak learning rate (constant after warm-up). RL moves a fine-tuned model a little: TRL's GRPO "
        "default, an order of magnitude below SFT's.",
    )
    warmup_fraction: float = Field(
        default=0.0, ge=0, lt=1, description="Share of max_steps warming the learning rate up."
    )
    max_steps: int = Field(default=200, ge=1, description="Optimizer steps.")
    save_steps: int = Field(default=25, ge=1, description="Checkpoint every this many steps (the resume point).")
    seed: int = Field(default=0, description="Seed of the prompt choice, the control instructions and training.")
    mixed_precision: MixedPrecision | None = Field(
        default=None,
        description="RL's training arithmetic, as `model.mixed_precision` (auto, bf16, native-bf16, none); None: "
        "`model.mixed_precision`. At `make learn`'s budgets RL under bf16 on a CPU scored measurably lower on the "
        "validation pool.",
    )
    fail_when_nothing_learned: bool = Field(
        default=True,
        description="A run in which no weight changed (every step's gradient norm 0, or the checkpoint equal to its "
        "start) fails the stage with the reason instead of completing (issue 16.4). Off only to exercise the "
        "machinery where learning is impossible by construction (a random model that never writes the thinking "
        "format, as in the project's resume tests): the stage then completes and its metrics carry "
        "`learned_nothing` with the reason.",
    )
    # --- GPU workers ------------------------------------------------------------------------------
    gpu: GPUWorkersConfig = Field(default_factory=GPUWorkersConfig, description="vLLM generation, memory savers.")
    output_dir: Path | None = Field(
        default=None, description="Where the checkpoint goes; None: `<workspace>/runs/rl/<fingerprint>`."
    )

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> "RLConfig":
        completions = self.per_device_batch_size * self.gradient_accumulation_steps
        if completions % self.num_generations:
            raise ValueError(
                f"per_device_batch_size x gradient_accumulation_steps = {completions} completions is not a multiple of "
                f"num_generations {self.num_generations}: TRL needs whole groups in a batch"
            )
        if self.epsilon_high < self.epsilon:
            raise ValueError(f"epsilon_high {self.epsilon_high} is below epsilon {self.epsilon}")
        return self
