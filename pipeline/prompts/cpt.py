"""The system prompt of continual pretraining: one fixed template over the five parts of SPEC.md.

CPT uses a single wording on purpose (SPEC.md, Stage 2: SFT varies its template, CPT keeps its
own). The task description names the domain so one model learns many environments without
confusing them; the optional parts appear only when the trajectory has them, so no empty
heading teaches the model that a section means nothing.
"""

import json
from typing import Any

from pipeline.store.schema import SystemPrompt

# How the task description names each domain of pipeline.store.schema.DOMAINS.
DOMAIN_NAMES = {
    "terminal": "a Linux terminal (shell commands in, stdout/stderr and the prompt out)",
    "swe": "a software-engineering workspace (file reads, edits and shell commands on a code repository)",
    "mcp": "MCP tool servers (JSON tool calls in, tool responses out)",
    "search": "a search engine and the web pages it returns",
    "web": "a web browser (browser actions in, the page's accessibility tree out)",
    "android": "an Android phone (GUI actions in, the view hierarchy out)",
    "os": "a desktop operating system (GUI actions in, the accessibility tree out)",
    "text-game": "a text game (commands in, room and event descriptions out)",
    "other": "an interactive software environment",
}

INSTRUCTION = (
    "An agent acts in this environment. After each action, reply with exactly the observation the "
    "environment returns, in its native format, and nothing else."
)


def tools_text(tools: list[dict[str, Any]]) -> str | None:
    """One tool specification per line as compact JSON, keys sorted so the same tools always read the
    same. Indented JSON would spend a third of a long tool list's tokens on whitespace."""
    if not tools:
        return None
    return "\n".join(json.dumps(tool, ensure_ascii=False, sort_keys=True) for tool in tools)


def render_cpt_system_prompt(domain: str, system: SystemPrompt) -> str:
    """The CPT system prompt of one trajectory."""
    description = DOMAIN_NAMES.get(domain, DOMAIN_NAMES["other"])
    task = [f"You simulate the environment of the {domain} domain: {description}.", INSTRUCTION]
    if system.task_description.strip():
        task.append(system.task_description.strip())
    sections = [("Task", "\n".join(task))]

    action_space = [part for part in (system.action_space, tools_text(system.tools)) if part and part.strip()]
    if action_space:
        sections.append(("Action space", "\n\n".join(part.strip() for part in action_space)))
    for title, text in (
        ("Initial state", system.initial_state),
        ("Demonstrations", system.demonstrations),
        ("Simulation instructions", system.simulation_instructions),
    ):
        if text and text.strip():
            sections.append((title, text.strip()))
    return "\n\n".join(f"# {title}\n{body}" for title, body in sections)
