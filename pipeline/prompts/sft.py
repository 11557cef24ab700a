"""The ten system-prompt templates of SFT samples (SPEC.md, Stage 2; issue 10).

Every template carries the same information, SPEC.md's five parts (task description, action
space, initial state, demonstrations, simulation instructions), but words it differently, orders
the parts differently and marks them up differently (Markdown headings, XML tags, brackets,
capitals, a numbered list, key-value lines), so the model learns the environment and not one
prompt's wording. Each SFT sample draws one uniformly, seeded by (seed, trajectory, turn), and the
draw is recorded with the sample. CPT keeps its single template (pipeline/prompts/cpt.py); RL gets
its own.

Every template words two instructions: the thinking format (reasoning inside `<think>...</think>`,
then the observation alone) and the direct format (the observation alone, as CPT trains it). The
model is hybrid (SPEC.md, Stage 2; issue 28): a stage trains and asks in the format
`answers.thinking` chooses, and the system prompt says which, as Qwen3's `enable_thinking` does. Optional parts appear only when the trajectory
has them, as in CPT: an empty heading would teach that a section can mean nothing.
"""

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.prompts.cpt import DOMAIN_NAMES, tools_text
from pipeline.store.schema import SystemPrompt

# Part names, in SPEC.md's order.
PARTS = ("task", "actions", "state", "demonstrations", "instructions")


def _markdown(title: str, body: str) -> str:
    return f"# {title}\n{body}"


def _markdown_h2(title: str, body: str) -> str:
    return f"## {title}\n\n{body}"


def _xml(title: str, body: str) -> str:
    tag = title.lower().replace(" ", "_")
    return f"<{tag}>\n{body}\n</{tag}>"


def _brackets(title: str, body: str) -> str:
    return f"[{title}]\n{body}"


def _capitals(title: str, body: str) -> str:
    return f"{title.upper()}:\n{body}"


def _rule(title: str, body: str) -> str:
    return f"=== {title} ===\n{body}"


def _bold(title: str, body: str) -> str:
    return f"**{title}**\n{body}"


def _key_value(title: str, body: str) -> str:
    return f"{title.lower().replace(' ', '_')}: |\n" + "\n".join(f"  {line}" for line in body.splitlines())


@dataclass(frozen=True)
class SFTTemplate:
    template_id: int
    intro: str  # formatted with {domain} and {description}
    instruction: str  # the thinking format: reasoning inside <think>...</think>, then the observation
    direct_instruction: str  # the direct format: the observation alone (issue 28, hybrid thinking)
    titles: dict[str, str]  # part -> heading
    order: tuple[str, ...]  # the order the parts appear in
    markup: Callable[[str, str], str]
    numbered: bool = False

    def render(self, domain: str, system: SystemPrompt, thinking: bool = True) -> str:
        """The system prompt asking for the thinking format, or with `thinking=False` the direct one."""
        description = DOMAIN_NAMES.get(domain, DOMAIN_NAMES["other"])
        task = [self.intro.format(domain=domain, description=description), self.instruction_for(thinking)]
        if system.task_description.strip():
            task.append(system.task_description.strip())
        action_space = [part for part in (system.action_space, tools_text(system.tools)) if part and part.strip()]
        bodies = {
            "task": "\n".join(task),
            "actions": "\n\n".join(part.strip() for part in action_space),
            "state": (system.initial_state or "").strip(),
            "demonstrations": (system.demonstrations or "").strip(),
            "instructions": (system.simulation_instructions or "").strip(),
        }
        present = [part for part in self.order if bodies[part]]
        sections = []
        for number, part in enumerate(present, start=1):
            title = f"{number}. {self.titles[part]}" if self.numbered else self.titles[part]
            sections.append(self.markup(title, bodies[part]))
        return "\n\n".join(sections)

    def instruction_for(self, thinking: bool) -> str:
        return self.instruction if thinking else self.direct_instruction


_STANDARD = {
    "task": "Task",
    "actions": "Action space",
    "state": "Initial state",
    "demonstrations": "Demonstrations",
    "instructions": "Simulation instructions",
}

TEMPLATES: tuple[SFTTemplate, ...] = (
    SFTTemplate(
        0,
        "You simulate the environment of the {domain} domain: {description}.",
        "An agent acts in this environment. For each action, first reason inside <think>...</think> about what "
        "the environment would do, then reply with exactly the observation it returns, in its native format.",
        "An agent acts in this environment. For each action, reply with exactly the observation the environment returns, in its native format, and nothing else.",
        _STANDARD,
        PARTS,
        _markdown,
    ),
    SFTTemplate(
        1,
        "Role: world model of a {domain} environment ({description}).",
        "Given the next agent action, think it through in a <think> block, close it with </think>, and then "
        "output only the environment's response, formatted as the environment would format it.",
        "Given the next agent action, output only the environment's response, formatted as the environment would format it.",
        {
            "task": "Role",
            "actions": "Available actions",
            "state": "Starting state",
            "demonstrations": "Examples",
            "instructions": "Behaviour controls",
        },
        ("task", "state", "actions", "demonstrations", "instructions"),
        _xml,
    ),
    SFTTemplate(
        2,
        "This is a simulation of {description} (domain: {domain}).",
        "You play the environment, not the agent. Reason step by step between <think> and </think>; after the "
        "closing tag write the observation and nothing else.",
        "You play the environment, not the agent. Write the observation and nothing else.",
        {
            "task": "Simulation",
            "actions": "What the agent can do",
            "state": "State at the start",
            "demonstrations": "Sample interactions",
            "instructions": "Special instructions",
        },
        ("task", "instructions", "actions", "state", "demonstrations"),
        _brackets,
    ),
    SFTTemplate(
        3,
        "Environment simulator. Domain: {domain}. It behaves like {description}.",
        "Answer every action in two parts: your reasoning wrapped in <think></think>, then the literal "
        "observation the real environment would produce.",
        "Answer every action with the literal observation the real environment would produce, and nothing more.",
        {
            "task": "Overview",
            "actions": "Interface",
            "state": "Environment state",
            "demonstrations": "Demonstrations",
            "instructions": "Instructions for the simulation",
        },
        PARTS,
        _capitals,
    ),
    SFTTemplate(
        4,
        "Pretend to be {description}. The domain is {domain}.",
        "Each user message is an action taken by an agent. Think privately in <think>...</think>, then respond "
        "exactly as the environment would: the raw observation, no commentary.",
        "Each user message is an action taken by an agent. Respond exactly as the environment would: the raw observation, no commentary.",
        {
            "task": "What you are",
            "actions": "Actions and tools",
            "state": "Initial conditions",
            "demonstrations": "Worked examples",
            "instructions": "Rules for this simulation",
        },
        ("task", "actions", "demonstrations", "state", "instructions"),
        _rule,
    ),
    SFTTemplate(
        5,
        "You are a {domain} environment ({description}) interacting with an autonomous agent.",
        "Predict the environment's next observation. Put your reasoning first, inside <think> and </think>; "
        "what follows the closing tag must be the observation exactly as the environment emits it.",
        "Predict the environment's next observation and write it exactly as the environment emits it.",
        {
            "task": "Environment",
            "actions": "Action space",
            "state": "Current state",
            "demonstrations": "Few-shot examples",
            "instructions": "Simulation settings",
        },
        ("task", "state", "instructions", "actions", "demonstrations"),
        _markdown_h2,
    ),
    SFTTemplate(
        6,
        "Simulated {domain} environment: {description}.",
        "Reason in a <think> block, end it with </think>, then print the observation. Keep the environment's "
        "own format: its JSON, its terminal output, its page text.",
        "Print the observation in the environment's own format: its JSON, its terminal output, its page text.",
        {
            "task": "Setting",
            "actions": "Tools",
            "state": "Initial state",
            "demonstrations": "Demonstrations",
            "instructions": "Simulation instructions",
        },
        ("task", "actions", "state", "instructions", "demonstrations"),
        _bold,
    ),
    SFTTemplate(
        7,
        "Act as the {domain} environment an agent is working in, namely {description}.",
        "For the agent's latest action: think about its effect inside <think>...</think>, then give the "
        "environment's observation verbatim and stop.",
        "For the agent's latest action, give the environment's observation verbatim and stop.",
        {
            "task": "Context",
            "actions": "Actions the agent may take",
            "state": "What exists at the start",
            "demonstrations": "Examples of actions and observations",
            "instructions": "Extra instructions",
        },
        ("task", "demonstrations", "actions", "state", "instructions"),
        _markdown,
        numbered=True,
    ),
    SFTTemplate(
        8,
        "World-model mode. Environment kind: {domain} ({description}).",
        "Output format: <think>your reasoning</think> followed by the observation the environment returns to "
        "this action, with nothing before or after it.",
        "Output format: the observation the environment returns to this action, with nothing before or after it.",
        {
            "task": "Mode",
            "actions": "Action schema",
            "state": "Initial state",
            "demonstrations": "Reference traces",
            "instructions": "Control instructions",
        },
        ("task", "instructions", "state", "actions", "demonstrations"),
        _key_value,
    ),
    SFTTemplate(
        9,
        "You will emulate {description} (the {domain} domain) for an agent under test.",
        "Think first, between <think> and </think>. Then write only what the environment would show the agent "
        "after this action.",
        "Write only what the environment would show the agent after this action.",
        {
            "task": "Emulation",
            "actions": "Commands and tools",
            "state": "Initial environment",
            "demonstrations": "Demonstrations",
            "instructions": "Simulation instructions",
        },
        ("task", "actions", "state", "demonstrations", "instructions"),
        _brackets,
        numbered=True,
    ),
)


def draw_template(seed: int, trajectory_id: str, turn_index: int) -> SFTTemplate:
    """The template of one sample: uniform over TEMPLATES, fixed by (seed, trajectory, turn), so a
    rerun and a resumed run draw the same one and no random generator's algorithm is involved."""
    key = f"{seed}\x1f{trajectory_id}\x1f{turn_index}".encode()
    value = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")
    return TEMPLATES[value % len(TEMPLATES)]
