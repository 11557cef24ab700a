"""RL's reward on its own prompts, before and after training (issue 28: "its reward measured on the same
prompts before and after training").

The per-step rewards of a GSPO run are of different prompts at different steps (a step's groups come
from one or a few prompts), so their rise or fall is mostly the prompts'. This measure holds the
prompts fixed: every training prompt is answered greedily by the starting model and by the trained
one, and each answer gets the rewards training gives (pipeline/rl/rewards.py `Rewards.combined`: the
main reward, the rule reward where the prompt carries a verifier, their weighted sum). The paired
difference over the prompts, with its bootstrap interval, says whether RL raised the reward it
optimises. Greedy, not sampled: one answer per prompt and model, reproducible.

Made where training runs, from files only; each set written once to the run's folder, so a resumed
run neither generates nor scores again.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.evaluation.intervals import bootstrap_mean, paired_difference
from pipeline.rl.prompts import RLPrompt
from pipeline.store.atomic_files import write_text_atomic

CACHE = "prompt_rewards_cache.duckdb"


def _path(output_dir: Path, name: str) -> Path:
    return output_dir / f"prompt_rewards_{name}.json"


def measure_prompt_rewards(
    prompts: Sequence[RLPrompt], model_ref: str, max_tokens: int, output_dir: Path, name: str, rewards
) -> list[dict[str, Any]]:
    """Per prompt: the greedy answer of `model_ref` and its rewards (kept under `name`)."""
    from pipeline.config.llm import EndpointConfig
    from pipeline.llm.client import ChatRequest, open_client
    from pipeline.store.database import Store
    from pipeline.training.validation import pass_rows

    path = _path(output_dir, name)
    if path.is_file():
        return json.loads(path.read_text())
    if not prompts:
        return []
    endpoint = EndpointConfig(
        backend="transformers",
        model=str(model_ref),
        temperature=0.0,
        max_tokens=max_tokens,
        batch_size=pass_rows(len(prompts)),
    )
    with Store(output_dir / CACHE) as scratch:
        client = open_client(endpoint, scratch, f"rl.prompt_rewards.{name}")
        answers = client.complete_sync([ChatRequest(tuple(prompt.messages)) for prompt in prompts])
    texts = [answer.text or "" for answer in answers]
    scored = rewards.combined(texts, [prompt.prompt_index for prompt in prompts])
    rows = [
        {"prompt_index": p.prompt_index, "text": a.text, "error": a.error, **s}
        for p, a, s in zip(prompts, answers, scored)
    ]
    write_text_atomic(path, json.dumps(rows, indent=2) + "\n")
    return rows


def prompt_reward_metrics(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """Both means with their intervals and the paired change, on the reward scale (0-25)."""
    if not before or not after:
        return {}
    first, last = bootstrap_mean([r["combined"] for r in before]), bootstrap_mean([r["combined"] for r in after])
    change = paired_difference([r["combined"] for r in after], [r["combined"] for r in before])
    return {
        "prompt_reward_before": first.mean,
        "prompt_reward_before_low": first.low,
        "prompt_reward_before_high": first.high,
        "prompt_reward_after": last.mean,
        "prompt_reward_after_low": last.low,
        "prompt_reward_after_high": last.high,
        "prompt_reward_change": change.mean,
        "prompt_reward_change_low": change.low,
        "prompt_reward_change_high": change.high,
        "prompt_reward_verdict": change.direction,
        "prompt_reward_prompts": change.n,
        "prompt_rule_reward_after": bootstrap_mean([r["rule"] for r in after]).mean,
    }
