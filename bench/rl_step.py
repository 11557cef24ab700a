"""What one GSPO step of the rl stage costs, split into generating the completions, rewarding them and the rest
(issue 28, item 5: "RL's step cost is measured in `bench/`"), each part a share of the step measured in the same run.

    python bench/rl_step.py [--model tiny] [--config data/configs/demo.yaml] [--steps 4] [--prompts 4]

The stage's own trainer settings (pipeline/rl/training.py `grpo_arguments`, from the config's `rl` section: the
demo's 4 completions of at most 160 tokens, one prompt a step, offline similarity reward), on prompts built as
the stage builds them (pipeline/rl/prompts.py, history within `rl.max_history_chars`) from the demo's terminal
trajectories, never from an eval or public file. `--model tiny` (default, a minute on 2 cores) is the offline
tiny random model built from the same file; `--model smollm2-135m-instruct` (or a GGUF file or a model folder) is
the demo's real model, 30-60 s a step on 2 cores. The first step is a warm-up and not counted.

A step is timed from TrainerCallback's `on_step_begin` to `on_step_end`: generation (GRPOTrainer's `_generate`),
rewards (`_calculate_rewards`), and the rest: the old log-probabilities, the loss's forward and backward passes
and the optimizer update. The shares, not the seconds, are the figures: the machine's speed moves by half over a
day, and a step's time follows the completions' length (printed beside it).
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPT_SOURCE = REPO / "data" / "demo" / "terminal.jsonl"
PARTS = ("generation", "rewards")


def model_ref(model: str, scratch: Path) -> str:
    """`tiny`: the tiny random model built from the prompts' file; anything else as bench/base_model.py resolves it."""
    if model == "tiny":
        from pipeline.config.model import TinyModelConfig
        from pipeline.training.tiny_model import build_tiny_model

        return str(build_tiny_model(TinyModelConfig(), [PROMPT_SOURCE], scratch / "tiny"))
    from bench.base_model import model_folder

    return model_folder(model, scratch)


def rl_prompts(config, count: int):
    """`count` target turns of the demo's terminal trajectories (a seeded choice) as RL's prompts: its history
    budget, its template and the answer format the config trains."""
    from pipeline.config.answers import resolve_thinking
    from pipeline.evaluation.benchmark import read_benchmark
    from pipeline.rl.prompts import build_prompts

    rl = config.rl
    items = read_benchmark([str(PROMPT_SOURCE)], "benchmark_target", rl.max_history_chars, count, rl.seed).items
    return build_prompts([item.query for item in items], {}, 0.0, rl.seed, resolve_thinking(config))


def timed_steps(config, ref: str, prompts, trainer_dir: Path) -> tuple[list[dict[str, float]], list[dict]]:
    """GSPO for `rl.max_steps` steps; per step its seconds and those of each part, and TRL's log entries."""
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from pipeline.config.answers import resolve_thinking
    from pipeline.rl.rewards import Rewards
    from pipeline.rl.training import _dataset, grpo_arguments
    from pipeline.training.models import load_causal_lm
    from pipeline.training.trainer import load_tokenizer_with_chatml

    steps: list[dict[str, float]] = []

    def timed(part: str, method):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                if steps:
                    steps[-1][part] += time.perf_counter() - start

        return wrapper

    class TimedGSPO(GRPOTrainer):
        def _generate(self, prompts):
            return timed("generation", super()._generate)(prompts)

        def _calculate_rewards(self, *args):
            return timed("rewards", super()._calculate_rewards)(*args)

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            steps.append({"start": time.perf_counter(), **dict.fromkeys(PARTS, 0.0)})

        def on_step_end(self, args, state, control, **kwargs):
            steps[-1]["seconds"] = time.perf_counter() - steps[-1].pop("start")

    tokenizer, _ = load_tokenizer_with_chatml(config, ref)
    rewards = Rewards(prompts, tokenizer, config.rl.reward, None, resolve_thinking(config))
    model = load_causal_lm(ref, config.model.dtype, config.model.trust_remote_code)
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))
    trainer = TimedGSPO(
        model=model,
        reward_funcs=rewards.functions(),
        args=grpo_arguments(config, trainer_dir, rewards.weights),
        train_dataset=_dataset(prompts),
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return steps, [entry for entry in trainer.state.log_history if "reward" in entry]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="tiny", help="`tiny`, or model.base: a packaged name, GGUF file or HF folder"
    )
    parser.add_argument(
        "--config", type=Path, default=REPO / "data" / "configs" / "demo.yaml", help="whose `rl` section sets the step"
    )
    parser.add_argument("--steps", type=int, default=4, help="GSPO steps, the first a warm-up")
    parser.add_argument("--prompts", type=int, default=4, help="prompts the steps cycle through")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first is a warm-up)")

    from pipeline.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        # No checkpoint inside the timed steps, and the offline reward: the judge's endpoint is not the step's cost.
        config = load_config(
            args.config,
            [
                {
                    "workspace": {"path": str(scratch / "workspace")},
                    "rl": {
                        "max_steps": args.steps,
                        "save_steps": args.steps + 1,
                        "reward": {"judge": {"kind": "semantic"}},
                    },
                }
            ],
        )
        ref = model_ref(args.model, scratch)
        prompts = rl_prompts(config, args.prompts)
        steps, logged = timed_steps(config, ref, prompts, scratch / "trainer")

    rl = config.rl
    prompts_a_step = rl.per_device_batch_size * rl.gradient_accumulation_steps // rl.num_generations
    print(
        f"GSPO steps of {args.model} ({args.config.name}): {rl.num_generations} completions of at most "
        f"{rl.max_completion_length} tokens a prompt, {prompts_a_step} prompt(s) a step; step 1 a warm-up"
    )
    print(f"{'step':>4}{'seconds':>9}{'generation':>12}{'rewards':>9}{'the rest':>10}{'completion tokens':>19}")
    logged += [{}] * (len(steps) - len(logged))  # TRL logs each optimizer step once (logging_steps 1)
    for number, (step, entry) in enumerate(zip(steps, logged), start=1):
        rest = step["seconds"] - sum(step[part] for part in PARTS)
        length = entry.get("completions/mean_length")
        print(
            f"{number:>4}{step['seconds']:>9.2f}{step['generation']:>12.2f}{step['rewards']:>9.2f}{rest:>10.2f}"
            f"{'-' if length is None else f'{length:.0f}':>19}"
        )
    counted = steps[1:]
    total = sum(step["seconds"] for step in counted)
    shares = {part: sum(step[part] for step in counted) / total for part in PARTS}
    shares["the rest"] = 1.0 - sum(shares.values())
    print(
        f"steps 2-{len(steps)}: median {statistics.median(step['seconds'] for step in counted):.2f} s a step; of the "
        "step: "
        + ", ".join(f"{part} {share:.2f}" for part, share in shares.items())
        + " (the rest: old log-probabilities, loss forward and backward, optimizer update)"
    )


if __name__ == "__main__":
    main()
