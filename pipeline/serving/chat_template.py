"""The chat template of an exported world model: ChatML laid out exactly as the training stages
lay out their sequences (pipeline/training/sequences.py, pipeline/sft/samples.py), so any
OpenAI-compatible server (`simulacra serve`, `vllm serve`) that applies it sends the model the
tokens it was trained on:

    <|im_start|>system\\n{world-model system prompt}<|im_end|>\\n
    <|im_start|>user\\n{action}<|im_end|>\\n<|im_start|>assistant\\n{observation}<|im_end|>\\n   (history)
    <|im_start|>user\\n{action}<|im_end|>\\n
    <|im_start|>assistant\\n                                                                   (generation prompt)

The system prompt comes either rendered (one system message, pipeline/serving/prompt_formats.py) or
as its parts (issue 19, deliver 2): system messages named for them (`{"role": "system", "name":
"domain", "content": "terminal"}`, then `task_description`, `action_space`, `initial_state`,
`demonstrations`, `simulation_instructions`) and the tools in the request's `tools`; the template then
renders the model's own prompt format from them, the same text as the training stages' renderer
(tests/test_export.py checks it on every demo trajectory), so a client of a server that applies this
template with the messages' `name` (vLLM, `simulacra serve`) gets exactly the training format. `transformers
serve` (5.24) drops `name`: there the system prompt goes rendered (docs/stages/export.md).

The answer format follows Qwen3's switch (issue 28): the variable `enable_thinking` (a server passes
it from the request's `chat_template_kwargs`, `apply_chat_template(..., enable_thinking=False)` from
its keyword arguments) chooses the instruction rendered from the parts, thinking or direct, and is
the model's trained format when not given. A format the model was not trained in, or a value that is
not a boolean, raises (`raise_exception`) naming the formats it was trained in. A system prompt sent
already rendered is the client's own: its instruction is what it says. The generation prompt is the
same in both formats: a thinking answer opens its own `<think>`, a direct one is the observation.

For a thinking model, an assistant message of the history loses its
`<think>...</think>` block and the blank line after it: SFT and RL samples carry no thinking in
their history (real trajectories have none), so a client that sends back what the model wrote
still gets the training layout. `developer` is the system role; a `tool` (or `function`) message is
an observation, the assistant role of training: the tool's answer is what the environment returned.
Content given as a list of text parts is joined with newlines (as vLLM joins them). Other roles are
refused.

Equality with training holds where the tokenizer's pre-tokenizer splits at the boundary between a
role header's newline and the content, which a byte-level BPE does for content that starts with a
letter, digit, punctuation or a single space; content starting with several newlines may tokenise
differently at its first token (tests/test_export.py checks real trajectories token for token).
"""

import json

from pipeline.prompts.cpt import DOMAIN_NAMES
from pipeline.serving.prompt_formats import ANSWER_FORMAT_NAMES, SYSTEM_PART_NAMES, PromptFormat

_ROLES_CHECK = (
    "{%- if message['role'] not in ['system', 'developer', 'user', 'assistant', 'tool', 'function'] -%}"
    "{{ raise_exception('world model chat: role ' + message['role'] + ' is not supported; "
    "send system, user (actions) and assistant (observations) messages') }}"
    "{%- endif -%}"
)

_CONTENT = (
    "{%- if message['content'] is none -%}{%- set content = '' -%}"
    "{%- elif message['content'] is string -%}{%- set content = message['content'] -%}"
    "{%- else -%}{%- set content = message['content'] | map(attribute='text') | join('\\n') -%}{%- endif -%}"
)

_ROLE = (
    "{%- set role = {'developer': 'system', 'tool': 'assistant', 'function': 'assistant'}.get(message['role'], "
    "message['role']) -%}"
)

# The thinking block of a history observation goes, with up to two newlines after it, as
# pipeline/sft/candidates.py parses a candidate.
_STRIP_THINKING = (
    "{%- if role == 'assistant' and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1] -%}"
    "{%- if content.startswith('\\n\\n') -%}{%- set content = content[2:] -%}"
    "{%- elif content.startswith('\\n') -%}{%- set content = content[1:] -%}{%- endif -%}"
    "{%- endif -%}"
)

_IS_PART = "message['role'] in ['system', 'developer'] and message.get('name') in " + json.dumps(
    list(SYSTEM_PART_NAMES)
)


def _literal(value) -> str:
    """A Python string or dict of strings as a Jinja literal (JSON's escapes are Jinja's)."""
    return json.dumps(value, ensure_ascii=True)


def _answer_mode(fmt: PromptFormat) -> str:
    """Jinja that sets `thinking` from `enable_thinking` (the trained format when undefined or none) and
    raises for a value that is not a boolean or a format the model was not trained in."""
    return (
        "{%- if enable_thinking is defined and enable_thinking is not none -%}"
        "{%- if enable_thinking is not boolean -%}"
        "{{ raise_exception('world model chat: enable_thinking must be true or false') }}"
        "{%- endif -%}"
        "{%- set thinking = enable_thinking -%}"
        "{%- else -%}{%- set thinking = " + _literal(fmt.thinking) + " -%}{%- endif -%}"
        "{%- if ("
        + _literal(ANSWER_FORMAT_NAMES[True])
        + " if thinking else "
        + _literal(ANSWER_FORMAT_NAMES[False])
        + ") not in "
        + _literal(list(fmt.answer_formats))
        + " -%}"
        "{{ raise_exception('world model chat: ' ~ ("
        + _literal(fmt.refusal(True))
        + " if thinking else "
        + _literal(fmt.refusal(False))
        + ")) }}"
        "{%- endif -%}"
    )


def _system_from_parts(fmt: PromptFormat) -> str:
    """Jinja that renders `fmt`'s system prompt from part messages, as SFTTemplate.render does in Python:
    the intro and the instruction of the answer format `thinking` asks for, the task description, the
    action space and tools (one compact JSON with sorted keys per line, pipeline/prompts/cpt.py's
    tools_text), then the other parts, each a Markdown section when it is not empty, in the layout's order."""
    layout = fmt.layout
    if layout.markup.__name__ != "_markdown" or layout.numbered:
        raise ValueError(f"prompt format {fmt.name}: only Markdown, unnumbered layouts render in the chat template")
    values = "".join(
        f"{{%- elif message['name'] == '{name}' -%}}{{%- set ns.{name} = content -%}}" for name in SYSTEM_PART_NAMES[1:]
    )
    return (
        "{%- set ns = namespace(found=false, domain='', task_description='', action_space=none, initial_state=none, "
        "demonstrations=none, simulation_instructions=none) -%}"
        "{%- for message in messages -%}{%- if " + _IS_PART + " -%}" + _CONTENT + "{%- set ns.found = true -%}"
        "{%- if message['name'] == 'domain' -%}{%- set ns.domain = content -%}" + values + "{%- endif -%}"
        "{%- endif -%}{%- endfor -%}"
        "{%- if ns.found -%}"
        "{%- set names = " + _literal(DOMAIN_NAMES) + " -%}"
        # As `simulacra serve` answers 400: a misspelt or missing domain rendered "the kitchen domain" or "the
        # domain", a prompt no stage trained on, without a word.
        "{%- if ns.domain not in names -%}{{ raise_exception('the `domain` part is ' ~ (ns.domain | tojson) ~ ', "
        "not one of " + ", ".join(DOMAIN_NAMES) + "') }}{%- endif -%}"
        "{%- set description = names[ns.domain] -%}"
        "{%- set task = [" + _literal(layout.intro) + " | replace('{domain}', ns.domain) | replace('{description}', "
        "description), "
        + _literal(layout.instruction)
        + " if thinking else "
        + _literal(layout.direct_instruction)
        + "] -%}"
        "{%- if ns.task_description | trim -%}{%- set task = task + [ns.task_description | trim] -%}{%- endif -%}"
        "{%- set actions = [] -%}"
        "{%- if ns.action_space and ns.action_space | trim -%}{%- set actions = actions + [ns.action_space | trim] -%}"
        "{%- endif -%}"
        "{%- set tools_text = (tools or []) | map('tojson', sort_keys=True) | join('\\n') -%}"
        "{%- if tools_text | trim -%}{%- set actions = actions + [tools_text | trim] -%}{%- endif -%}"
        "{%- set bodies = {'task': task | join('\\n'), 'actions': actions | join('\\n\\n'), "
        "'state': (ns.initial_state or '') | trim, 'demonstrations': (ns.demonstrations or '') | trim, "
        "'instructions': (ns.simulation_instructions or '') | trim} -%}"
        "{%- set titles = " + _literal(layout.titles) + " -%}"
        "{%- set out = namespace(text='', first=true) -%}"
        "{%- for part in " + _literal(list(layout.order)) + " -%}{%- if bodies[part] -%}"
        "{%- if not out.first -%}{%- set out.text = out.text ~ '\\n\\n' -%}{%- endif -%}"
        "{%- set out.text = out.text ~ '# ' ~ titles[part] ~ '\\n' ~ bodies[part] -%}{%- set out.first = false -%}"
        "{%- endif -%}{%- endfor -%}"
        "{{ '<|im_start|>system\\n' + out.text + '<|im_end|>\\n' }}"
        "{%- endif -%}"
    )


def chat_template(fmt: PromptFormat) -> str:
    """The Jinja chat template for a model of prompt format `fmt`, answering in its trained format unless
    `enable_thinking` asks for another it was trained in."""
    return (
        _answer_mode(fmt)
        + _system_from_parts(fmt)
        + "{%- for message in messages -%}"
        + _ROLES_CHECK
        + "{%- if not ("
        + _IS_PART
        + ") -%}"
        + _CONTENT
        + _ROLE
        + (_STRIP_THINKING if fmt.thinking else "")
        + "{{ '<|im_start|>' + role + '\\n' + content + '<|im_end|>\\n' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
    )
