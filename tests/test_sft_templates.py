"""The ten SFT system-prompt templates: same information, different wording, order and markup."""

from collections import Counter

from pipeline.prompts.cpt import render_cpt_system_prompt
from pipeline.prompts.sft import TEMPLATES, draw_template
from pipeline.store.schema import SystemPrompt

FULL = SystemPrompt(
    task_description="Help the user manage files.",
    action_space="Shell commands, one per message.",
    tools=[{"name": "run", "parameters": {"cmd": "string"}}],
    initial_state="~/notes.txt exists",
    demonstrations="> ls\nnotes.txt",
    simulation_instructions="Inject an intermittent I/O error.",
)
PART_TEXTS = [
    "Help the user manage files.",
    "Shell commands, one per message.",
    '"name": "run"',
    "~/notes.txt exists",
    "notes.txt",
    "Inject an intermittent I/O error.",
]


def test_ten_templates_each_carry_all_five_parts_and_ask_for_thinking():
    assert [t.template_id for t in TEMPLATES] == list(range(10))
    for template in TEMPLATES:
        text = template.render("terminal", FULL)
        missing = [part for part in PART_TEXTS if part not in text]
        assert not missing, (template.template_id, missing)
        assert "<think>" in text and "terminal" in text


def test_templates_differ_in_wording_order_and_markup():
    texts = [t.render("terminal", FULL) for t in TEMPLATES]
    assert len(set(texts)) == 10
    assert len({t.intro for t in TEMPLATES}) == 10 and len({t.instruction for t in TEMPLATES}) == 10
    assert len({t.order for t in TEMPLATES}) >= 5
    assert len({t.markup for t in TEMPLATES}) >= 7
    assert all(text != render_cpt_system_prompt("terminal", FULL) for text in texts)


def test_absent_optional_parts_leave_no_empty_heading():
    bare = SystemPrompt(task_description="Play the game.")
    for template in TEMPLATES:
        text = template.render("text-game", bare)
        assert template.titles["state"] not in text and template.titles["demonstrations"] not in text


def test_draw_is_seeded_and_roughly_uniform():
    draws = Counter(draw_template(0, f"trajectory-{i}", i % 7).template_id for i in range(5000))
    assert set(draws) == set(range(10))
    assert max(draws.values()) - min(draws.values()) < 150  # about 500 each
    assert draw_template(0, "t", 3) == draw_template(0, "t", 3)
    assert [draw_template(s, "t", 3).template_id for s in range(20)] != [draw_template(0, "t", 3).template_id] * 20
