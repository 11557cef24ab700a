"""RL prompts: one target turn per trajectory, the fixed RL template, seeded control instructions."""

import pytest

from pipeline.config.rl import RLConfig
from pipeline.prompts.rl import RL_TEMPLATE, rl_messages
from pipeline.prompts.sft import TEMPLATES
from pipeline.rl.controls import CONTROLS, KINDS, draw_control
from pipeline.rl.prompts import EchoTrap, select_targets
from pipeline.store.schema import ScoredTurn, SystemPrompt

SYSTEM = SystemPrompt(task_description="Inspect the server.", action_space="bash", simulation_instructions="Be terse.")


def test_two_targets_of_one_trajectory_are_refused():
    with pytest.raises(EchoTrap, match="one turn per trajectory"):
        select_targets([("a", 1), ("b", 2), ("a", 5)], None, 0)


def test_the_choice_is_seeded_and_a_larger_budget_takes_a_superset():
    targets = [(f"t{i}", i % 7) for i in range(50)]
    small, large = select_targets(targets, 10, 3), select_targets(targets, 20, 3)
    assert small == select_targets(targets, 10, 3) and small == large[:10]
    assert select_targets(targets, 10, 4) != small


def test_the_control_share_and_kinds():
    ids = [f"trajectory-{i}" for i in range(4000)]
    drawn = [draw_control(7, i, 0.25) for i in ids]
    share = sum(kind is not None for kind in drawn) / len(ids)
    assert 0.22 < share < 0.28
    assert {kind for kind in drawn if kind} == set(KINDS)  # all four of SPEC's faults occur
    assert drawn == [draw_control(7, i, 0.25) for i in ids]  # fixed by (seed, trajectory)
    assert all(draw_control(7, i, 0.0) is None for i in ids[:100])
    assert all(draw_control(7, i, 1.0) is not None for i in ids[:100])


# control -> what the system prompt's simulation instructions hold, in order
INSTRUCTION_CASES = [
    (None, ["Be terse."]),
    ("paginated_response", ["Be terse.", CONTROLS["paginated_response"]]),
]


@pytest.mark.parametrize(("control", "expected"), INSTRUCTION_CASES)
def test_a_control_instruction_joins_the_simulation_instructions(control, expected):
    history = [ScoredTurn(0, "ls", "app.py", "retrieval", 1.0)]
    messages = rl_messages("terminal", SYSTEM, history, "cat app.py", CONTROLS[control] if control else None)
    system = messages[0]["content"]
    section = system.split("# Simulation instructions\n", 1)[1]
    assert [line for line in section.split("\n\n") if line] == expected
    assert "<think>...</think>" in system  # the thinking format the SFT model learnt
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"] == "cat app.py"


def test_the_rl_template_is_none_of_the_sft_templates():
    assert RL_TEMPLATE.template_id not in {t.template_id for t in TEMPLATES}
    assert RL_TEMPLATE.instruction not in {t.instruction for t in TEMPLATES}


# config fields -> the error it must give (TRL needs whole groups; GSPO's clipping range is ordered)
CONFIG_ERRORS = [
    ({"num_generations": 3, "per_device_batch_size": 8}, "not a multiple of num_generations 3"),
    ({"epsilon": 5e-4, "epsilon_high": 4e-4}, "epsilon_high"),
    ({"reward": {"main_weight": 0, "rule_weight": 0}}, "both 0"),
    ({"reward": {"judge": {"kind": "llm"}}}, "needs `endpoint.model`"),
]


@pytest.mark.parametrize(("fields", "message"), CONFIG_ERRORS)
def test_config_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        RLConfig(**fields)


@pytest.mark.parametrize(
    ("share", "limit", "expected"),
    [
        (0.0, 3, ["q0", "q1", "q2"]),  # the plain seeded choice
        (0.25, 4, ["q0", "q1", "q2", "q5"]),  # one verified prompt at least: the first in rank (q5)
        (0.5, 4, ["q0", "q1", "q5", "q7"]),  # two: q5 and q7, the rest in rank; the result in rank order
        (1.0, 4, ["q0", "q1", "q5", "q7"]),  # only two exist: they, and the first others in rank
        (0.5, None, [f"q{i}" for i in range(8)]),  # no limit: every query
    ],
)
def test_a_share_of_the_prompts_carries_a_verifier_where_verifiers_exist(share, limit, expected):
    """`rl.verifier_share`: the rule reward fires only on prompts with a verifier, so a small choice is made to
    hold some; otherwise the seeded rank order decides, and the result keeps it."""
    from pipeline.sft.queries import Query
    from pipeline.store.schema import SystemPrompt
    from stages.rl import choose_with_verifiers

    ranked = [Query(f"q{i}", 0, "terminal", SystemPrompt(task_description="t"), (), "ls", "x", 0) for i in range(8)]
    code = {("q5", 0): "def verify(p): return True", ("q7", 0): "def verify(p): return True"}
    chosen = choose_with_verifiers(ranked, code, limit, share)
    assert [q.trajectory_id for q in chosen] == expected


def test_verified_turns_stand_in_for_their_trajectory_targets_when_too_few_targets_carry_one():
    """A trajectory's one RL target is a seeded turn, rarely the one its verifier checks: another turn of a
    ranked trajectory that carries a verifier takes that trajectory's place, so the wanted share holds
    verified prompts and no trajectory gives two (SPEC's echo trap)."""
    from pipeline.sft.queries import Query
    from pipeline.store.schema import SystemPrompt
    from stages.rl import choose_with_verifiers

    def query(trajectory: str, turn: int) -> Query:
        return Query(trajectory, turn, "terminal", SystemPrompt(task_description="t"), (), "ls", "x", 0)

    ranked = [query(f"q{i}", 0) for i in range(6)]
    code = {
        ("q4", 3): "def verify(p): return True",
        ("q1", 2): "def verify(p): return True",
        ("zz", 1): "def verify(p): return True",
    }
    alternates = [query("q4", 3), query("zz", 1), query("q1", 2)]  # zz is not a ranked trajectory
    chosen = choose_with_verifiers(ranked, code, 3, 0.5, alternates)
    assert [(q.trajectory_id, q.turn_index) for q in chosen] == [("q0", 0), ("q1", 2), ("q4", 3)]
    chosen = choose_with_verifiers(ranked, code, 3, 0.0, alternates)
    assert [(q.trajectory_id, q.turn_index) for q in chosen] == [("q0", 0), ("q1", 0), ("q2", 0)]
