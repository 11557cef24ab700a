"""Which prompt an exported world model expects: the system template and output format of the stage
that trained it last.

Each training stage has its own prompt family (SPEC.md, Stage 2: "CPT uses its own fixed template,
RL another", SFT draws from ten): a model answers best in the format it was trained on last. The
export records the format's name in `simulacra.json`, and everything that builds a request for the
model (the chat template's caller, the server's structured requests, the environment class) renders
the system prompt with it. SFT trained on ten templates; serving uses the first, as SFT's own
held-out score does (stages/sft.py), so a prompt is the same on every request.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pipeline.prompts.cpt import INSTRUCTION, render_cpt_system_prompt
from pipeline.prompts.rl import RL_TEMPLATE
from pipeline.prompts.sft import _STANDARD, PARTS, TEMPLATES, SFTTemplate, _markdown
from pipeline.store.schema import SystemPrompt

# CPT's fixed template in the SFT templates' terms (Markdown sections, the same titles and order), so the
# exported chat template can render it too (pipeline/serving/chat_template.py); tests/test_export.py
# checks it renders what render_cpt_system_prompt does, on every demo trajectory.
CPT_LAYOUT = SFTTemplate(-1, "You simulate the environment of the {domain} domain: {description}.", INSTRUCTION,
                         _STANDARD, PARTS, _markdown)


@dataclass(frozen=True)
class PromptFormat:
    name: str
    thinking: bool  # the model writes <think>...</think> before the observation
    render_system: Callable[[str, SystemPrompt], str]
    layout: SFTTemplate  # the same prompt as data: what the chat template renders from the five parts


PROMPT_FORMATS: dict[str, PromptFormat] = {
    "cpt": PromptFormat("cpt", False, render_cpt_system_prompt, CPT_LAYOUT),
    "sft": PromptFormat("sft", True, TEMPLATES[0].render, TEMPLATES[0]),
    "rl": PromptFormat("rl", True, RL_TEMPLATE.render, RL_TEMPLATE),
}

# The system-prompt parts a client may send as system messages named for them, instead of the rendered
# prompt (the chat template and the server render them); `tools` travel in the request's `tools`.
SYSTEM_PART_NAMES = ("domain", "task_description", "action_space", "initial_state", "demonstrations",
                     "simulation_instructions")


def prompt_format(name: str) -> PromptFormat:
    if name not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {name!r}; formats are {', '.join(PROMPT_FORMATS)}")
    return PROMPT_FORMATS[name]


def with_controls(system: SystemPrompt, controls: Sequence[str]) -> SystemPrompt:
    """Control instructions ("inject an intermittent API error", "paginate the response") join the
    simulation-instructions part after the trajectory's own, so they are the last word on this step
    (SPEC.md, Stage 3: control instructions live in the simulation-instructions part)."""
    extra = [text.strip() for text in controls if text.strip()]
    if not extra:
        return system
    own = (system.simulation_instructions or "").strip()
    return replace(system, simulation_instructions="\n\n".join(([own] if own else []) + extra))


def part_messages(domain: str, system: SystemPrompt) -> list[dict[str, str]]:
    """The system prompt as named parts (SYSTEM_PART_NAMES), for any server applying the exported chat
    template; `system.tools` go in the request's `tools`."""
    values = {"domain": domain, "task_description": system.task_description, "action_space": system.action_space,
              "initial_state": system.initial_state, "demonstrations": system.demonstrations,
              "simulation_instructions": system.simulation_instructions}
    return [{"role": "system", "name": name, "content": values[name]} for name in SYSTEM_PART_NAMES
            if values[name] is not None]


def world_model_messages(
    fmt: PromptFormat,
    domain: str,
    system: SystemPrompt,
    turns: Sequence[tuple[str, str]],
    action: str,
    controls: Sequence[str] = (),
) -> list[dict[str, str]]:
    """The chat messages of one world-model query: the system prompt in `fmt`, the history as
    user (action) / assistant (observation) pairs, then the action, as the training stages lay them out."""
    messages = [{"role": "system", "content": fmt.render_system(domain, with_controls(system, controls))}]
    for past_action, observation in turns:
        messages += [{"role": "user", "content": past_action}, {"role": "assistant", "content": observation}]
    messages.append({"role": "user", "content": action})
    return messages
