"""Which prompt an exported world model expects: the system template of the stage that trained it
last, and the answer format it was trained in (thinking or direct).

Each training stage has its own prompt family (SPEC.md, Stage 2: "CPT uses its own fixed template,
RL another", SFT draws from ten): a model answers best in the template it was trained on last. The
export records the template's name and the answer format in `simulacra.json`, and everything that
builds a request for the model (the chat template, the server's structured requests, the environment
class) renders the system prompt with them. SFT trained on ten templates; serving uses the first, as
SFT's own held-out score does (stages/sft.py), so a prompt is the same on every request.

The model is hybrid as Qwen3's are (SPEC.md, Stage 2; issue 28): the system prompt asks for the
thinking answer (`<think>...</think>`, then the observation) or the direct one (the observation
alone), and a request chooses with `chat_template_kwargs: {"enable_thinking": ...}`, by default the
format the model was trained in. A format it was not trained in is refused (`answer_mode`), never
served: the model would answer it with whatever its training makes of an instruction it never saw.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipeline.prompts.cpt import INSTRUCTION, render_cpt_system_prompt
from pipeline.prompts.rl import RL_TEMPLATE
from pipeline.prompts.sft import _STANDARD, PARTS, TEMPLATES, SFTTemplate, _markdown
from pipeline.store.schema import SystemPrompt

# CPT's fixed template in the SFT templates' terms (Markdown sections, the same titles and order), so the
# exported chat template can render it too (pipeline/serving/chat_template.py); tests/test_export.py
# checks it renders what render_cpt_system_prompt does, on every demo trajectory.
CPT_LAYOUT = SFTTemplate(
    -1,
    "You simulate the environment of the {domain} domain: {description}.",
    INSTRUCTION,
    INSTRUCTION,
    _STANDARD,
    PARTS,
    _markdown,
)


ANSWER_FORMAT_NAMES = {True: "thinking", False: "direct"}


class UntrainedAnswerFormat(ValueError):
    """A request asked for an answer format (thinking or direct) the model was not trained in."""


@dataclass(frozen=True)
class PromptFormat:
    name: str  # the template family: cpt, sft or rl, the stage that trained the model last
    thinking: bool  # the answer format it was trained in, and what a request gets unless it asks for another
    layout: SFTTemplate  # the same prompt as data: what the chat template renders from the five parts

    @property
    def answer_formats(self) -> tuple[str, ...]:
        """The answer formats the model was trained in, by name (`simulacra.json`'s `answer_formats`)."""
        return (ANSWER_FORMAT_NAMES[self.thinking],)

    def render_system(self, domain: str, system: SystemPrompt, thinking: bool | None = None) -> str:
        """The system prompt asking for the thinking answer or, with `thinking=False`, the direct one;
        None: the trained format. CPT's template has one instruction, the direct one."""
        if self.name == "cpt":
            return render_cpt_system_prompt(domain, system)
        return self.layout.render(domain, system, self.thinking if thinking is None else thinking)

    def refusal(self, thinking: bool) -> str:
        """Why a request for `thinking` is refused: one line naming the formats the model was trained in."""
        return (
            f"enable_thinking={str(thinking).lower()} asks for the {ANSWER_FORMAT_NAMES[thinking]} answer format, "
            f"which this model was not trained in (answer formats: {', '.join(self.answer_formats)}): omit it or "
            f'send chat_template_kwargs {{"enable_thinking": {str(self.thinking).lower()}}}'
        )

    def answer_mode(self, enable_thinking: bool | None) -> bool:
        """Whether a request is answered thinking: its `enable_thinking`, else the trained format."""
        if enable_thinking is None:
            return self.thinking
        if ANSWER_FORMAT_NAMES[enable_thinking] not in self.answer_formats:
            raise UntrainedAnswerFormat(self.refusal(enable_thinking))
        return enable_thinking


# The templates with the answer format each was trained in before the project was hybrid (sft and rl
# thinking), the format of an export whose simulacra.json does not say.
PROMPT_FORMATS: dict[str, PromptFormat] = {
    "cpt": PromptFormat("cpt", False, CPT_LAYOUT),
    "sft": PromptFormat("sft", True, TEMPLATES[0]),
    "rl": PromptFormat("rl", True, RL_TEMPLATE),
}

# The system-prompt parts a client may send as system messages named for them, instead of the rendered
# prompt (the chat template and the server render them); `tools` travel in the request's `tools`.
SYSTEM_PART_NAMES = (
    "domain",
    "task_description",
    "action_space",
    "initial_state",
    "demonstrations",
    "simulation_instructions",
)


def prompt_format(name: str, thinking: bool | None = None) -> PromptFormat:
    """The template `name` for a model trained to answer thinking (`thinking=True`) or directly; None: the
    template's format before the project was hybrid (PROMPT_FORMATS)."""
    if name not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {name!r}; formats are {', '.join(PROMPT_FORMATS)}")
    if thinking and name == "cpt":
        raise ValueError("prompt format cpt asks for the direct answer only: CPT trains no thinking")
    return PROMPT_FORMATS[name] if thinking is None else replace(PROMPT_FORMATS[name], thinking=thinking)


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
    values = {
        "domain": domain,
        "task_description": system.task_description,
        "action_space": system.action_space,
        "initial_state": system.initial_state,
        "demonstrations": system.demonstrations,
        "simulation_instructions": system.simulation_instructions,
    }
    return [
        {"role": "system", "name": name, "content": content}
        for name in SYSTEM_PART_NAMES
        if (content := values[name]) is not None
    ]


def world_model_messages(
    fmt: PromptFormat,
    domain: str,
    system: SystemPrompt,
    turns: Sequence[tuple[str, str]],
    action: str,
    controls: Sequence[str] = (),
    thinking: bool | None = None,
) -> list[dict[str, str]]:
    """The chat messages of one world-model query: the system prompt in `fmt` asking for the thinking or
    the direct answer (None: the trained one), the history as user (action) / assistant (observation)
    pairs, then the action, as the training stages lay them out."""
    messages = [{"role": "system", "content": fmt.render_system(domain, with_controls(system, controls), thinking)}]
    for past_action, observation in turns:
        messages += [{"role": "user", "content": past_action}, {"role": "assistant", "content": observation}]
    messages.append({"role": "user", "content": action})
    return messages
