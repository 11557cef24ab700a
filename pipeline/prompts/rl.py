"""The RL system prompt: one fixed template (SPEC.md, Stage 2: "CPT uses its own fixed template, RL another").

The same five parts as the SFT templates (pipeline/prompts/sft.py), in the answer format the SFT
model was trained on (`answers.thinking`): reasoning inside `<think>...</think>`, then the
observation alone, which is what the rewards extract strictly (pipeline/rl/rewards.py); or directly
the observation alone. One template, not ten: RL optimises the
policy's behaviour, and a prompt that varies would add reward variance that no completion caused.
A control instruction (pipeline/rl/controls.py) joins the trajectory's own simulation instructions,
after them, so it is the last word on how to simulate this step.
"""

from collections.abc import Sequence
from dataclasses import replace

from pipeline.prompts.sft import SFTTemplate, _markdown
from pipeline.store.schema import ScoredTurn, SystemPrompt

RL_TEMPLATE = SFTTemplate(
    template_id=100,  # outside the SFT draw's 0-9, so a record never confuses the two
    intro="You are the environment of the {domain} domain ({description}), simulated for an agent.",
    instruction="For the agent's action, reason inside <think>...</think> about what the environment does, then, "
    "after </think>, write the observation the environment returns, exactly and in its native format, and nothing else.",
    direct_instruction="For the agent's action, write the observation the environment returns, exactly and in its native "
    "format, and nothing else.",
    titles={
        "task": "Environment",
        "actions": "Action space",
        "state": "Initial state",
        "demonstrations": "Demonstrations",
        "instructions": "Simulation instructions",
    },
    order=("task", "actions", "state", "demonstrations", "instructions"),
    markup=_markdown,
)


def rl_system_prompt(domain: str, system: SystemPrompt, control_instruction: str | None, thinking: bool = True) -> str:
    if control_instruction:
        own = (system.simulation_instructions or "").strip()
        system = replace(
            system, simulation_instructions=f"{own}\n\n{control_instruction}" if own else control_instruction
        )
    return RL_TEMPLATE.render(domain, system, thinking)


def rl_messages(
    domain: str,
    system: SystemPrompt,
    history: Sequence[ScoredTurn],
    action: str,
    control_instruction: str | None,
    thinking: bool = True,
) -> list[dict[str, str]]:
    """The conversation the policy completes: system prompt (asking for the thinking or the direct
    format), the kept history (observations without thinking, as in SFT samples), the target action."""
    messages = [{"role": "system", "content": rl_system_prompt(domain, system, control_instruction, thinking)}]
    for turn in history:
        messages += [{"role": "user", "content": turn.action}, {"role": "assistant", "content": turn.observation}]
    messages.append({"role": "user", "content": action})
    return messages
