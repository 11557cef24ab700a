"""The three demo environments as gymnasium environments over the real engines (issue 31, deliver 2):
gymnasium's checker passes; a seed deals one task, and seed N is the corpus's trajectory N (its task,
system prompt and initial observation, and its actions replayed give its observations); the success
check, a function of the observations, agrees with the corpus's outcomes and the engine's goal; a
check does not hang on what the service makes up at run time; the terminal's sandbox goes on close."""

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env

from pipeline.environments.bookstore_env import (
    BookstoreEnv,
    GenreListed,
    OrderChanged,
    OrderPlaced,
    OrderRefused,
    OrderShown,
    ResultsShown,
    ReturnOpened,
    bookstore_task,
)
from pipeline.environments.household import goal_met
from pipeline.environments.household_env import HouseholdEnv, HouseholdGoal, household_task
from pipeline.environments.terminal import Sandbox
from pipeline.environments.terminal_env import ShellGoal, TerminalEnv, terminal_task
from pipeline.formats.openai_chat import Adapter as OpenAIChat
from pipeline.formats.simulacra_jsonl import Adapter as SimulacraJsonl
from pipeline.formats.text_game import Adapter as TextGame
from pipeline.serving.episode import EpisodeSpec
from pipeline.store.schema import Trajectory

DEMO = Path(__file__).resolve().parents[1] / "data" / "demo"
ENVIRONMENTS = {
    "text-game": (HouseholdEnv, household_task),
    "mcp": (BookstoreEnv, bookstore_task),
    "terminal": (TerminalEnv, terminal_task),
}
# The builder's conversations redrawn because their calls and replies repeated an earlier one's
# (data/demo_builder/tool_calls.py): the environment deals the first draw, so these may differ.
REDRAWN_CONVERSATIONS = {8, 49, 65, 79, 102, 109, 112, 115, 119}


@pytest.fixture(params=list(ENVIRONMENTS))
def domain(request) -> str:
    return request.param


@pytest.fixture
def environment(domain):
    env = ENVIRONMENTS[domain][0]()
    yield env
    env.close()


def corpus(domain: str) -> list[tuple[int, Trajectory]]:
    """(index, trajectory) of every corpus trajectory of the domain, as ingestion reads it."""
    if domain == "terminal":
        records = [json.loads(line) for line in (DEMO / "terminal.jsonl").read_text().splitlines()]
        return [(i, SimulacraJsonl().parse(record, None)) for i, record in enumerate(records)]
    if domain == "mcp":
        conversations = json.loads((DEMO / "tool_calls.json").read_text())
        return [(i, OpenAIChat().parse(conversation, None)) for i, conversation in enumerate(conversations)]
    return [
        (int(path.name.split("-")[1]), TextGame().parse(path.read_text(), None))
        for path in sorted((DEMO / "text_games").glob("*.txt"))
    ]


def machine_has_the_corpus_tools() -> bool:
    """terminal_env.md's tool versions are this machine's: only then are bash's messages the corpus's."""
    recorded = re.findall(r"^\$ (.+)\n(.+)$", (DEMO / "terminal_env.md").read_text(), re.MULTILINE)
    with Sandbox() as sandbox:
        return all(sandbox.run(command)[0].splitlines()[0] == line for command, line in recorded)


def steps_of(trajectory: Trajectory) -> list[tuple[str, str]]:
    return [(turn.action, turn.observation) for turn in trajectory.turns]


def test_gymnasium_check_env_passes(environment):
    check_env(environment, skip_render_check=True)


def test_a_seed_deals_one_task_the_task_function_deals_too(domain, environment):
    tasks = ENVIRONMENTS[domain][1]
    first, info = environment.reset(seed=5)
    again, info_again = environment.reset(seed=5)
    other = environment.reset(seed=6)[1]["task_spec"]
    assert (first, info["task_spec"]) == (again, info_again["task_spec"]) == (first, tasks(5))
    assert other != info["task_spec"] and other == tasks(6)
    assert first == (info["task_spec"].system.initial_state or "")


def test_the_solution_succeeds_and_the_same_actions_get_the_same_observations(environment):
    """The solution's episode ends in success, with reward 1.0 on that step alone (in the terminal it may come
    before the plan's end: a config edit shows in `diff` already). Same seed, same actions, same observations,
    the terminal's too: the families' commands print no clock, pid or temporary path."""
    for seed in range(10):
        runs = []
        for _ in range(2):
            task = environment.reset(seed=seed)[1]["task_spec"]
            outcomes = []
            for action in task.solution:
                outcomes.append(environment.step(action))
                if outcomes[-1][2]:
                    break
            assert [(reward, terminated, truncated) for _, reward, terminated, truncated, _ in outcomes] == [
                (0.0, False, False)
            ] * (len(outcomes) - 1) + [(1.0, True, False)], seed
            runs.append([observation for observation, *_ in outcomes])
        assert runs[0] == runs[1], seed


def test_the_step_limit_truncates(environment):
    task = environment.reset(seed=3)[1]["task_spec"]
    # The vocabulary's first action ("look", "ls -1", a customer lookup) never does a task.
    outcomes = [environment.step(task.vocabulary[0]) for _ in range(task.max_steps)]
    assert [truncated for *_, truncated, _ in outcomes] == [False] * (task.max_steps - 1) + [True]
    assert not any(terminated for _, _, terminated, _, _ in outcomes)


def test_the_task_is_the_seeds_and_steps_need_a_reset(environment):
    with pytest.raises(RuntimeError, match="step before reset"):
        environment.step("look")
    with pytest.raises(ValueError, match="takes no options"):
        environment.reset(seed=0, options={"task": "something else"})


def test_seed_n_is_the_corpus_trajectory_n_and_replays_its_observations(domain):
    """Task, system prompt and domain as the corpus presents them once ingested, the initial observation
    its initial state, and each of its actions answered with its observation."""
    if domain == "terminal" and not machine_has_the_corpus_tools():
        pytest.skip("this machine's bash/coreutils/Python differ from the corpus's (terminal_env.md)")
    env = ENVIRONMENTS[domain][0]()
    replayed, differing = 0, set()
    try:
        for index, trajectory in corpus(domain):
            observation, info = env.reset(seed=index)
            task = info["task_spec"]
            if info["task"] != trajectory.task:
                differing.add(index)
                continue
            assert (task.domain, task.system, observation) == (
                trajectory.domain,
                trajectory.system,
                trajectory.system.initial_state or "",
            ), index
            assert [(action, env.step(action)[0]) for action, _ in steps_of(trajectory)] == steps_of(trajectory), index
            replayed += 1
    finally:
        env.close()
    assert differing <= (REDRAWN_CONVERSATIONS if domain == "mcp" else set())
    assert replayed >= 100


def test_the_episode_options_ask_a_simulator_the_corpus_system_prompt(domain):
    """What `WorldModelEnv.reset(options=...)` builds its prompt from is the corpus trajectory's system prompt."""
    index, trajectory = corpus(domain)[0]
    task = ENVIRONMENTS[domain][1](index)
    episode = EpisodeSpec.from_mapping(task.episode_options())
    assert replace(episode.system, task_description=episode.task) == trajectory.system
    assert episode.max_steps == task.max_steps


def test_the_terminal_check_agrees_with_every_corpus_outcome():
    verdicts = [
        (terminal_task(index).success(steps_of(trajectory)), trajectory.outcome_reward == 1.0)
        for index, trajectory in corpus("terminal")
    ]
    assert [check for check, _ in verdicts] == [outcome for _, outcome in verdicts]
    assert {outcome for _, outcome in verdicts} == {True, False}  # the corpus cuts about one run in ten short


def test_the_household_check_agrees_with_the_engines_goal_on_every_corpus_game():
    env = HouseholdEnv()
    verdicts = []
    for index, trajectory in corpus("text-game"):
        task = env.reset(seed=index)[1]["task_spec"]
        for action, _ in steps_of(trajectory):
            env.step(action)
        verdicts.append((task.success(steps_of(trajectory)), goal_met(env.household, env.game_task)))
    assert [check for check, _ in verdicts] == [goal for _, goal in verdicts]
    assert {goal for _, goal in verdicts} == {True, False}  # 98 games won, 2 out of actions


def test_the_bookstore_check_passes_where_the_corpus_agent_served_the_request():
    failed = [
        index
        for index, trajectory in corpus("mcp")
        if bookstore_task(index).task == trajectory.task and not bookstore_task(index).success(steps_of(trajectory))
    ]
    # Conversation 28: the customer mistyped O2012 as O2112 and the scripted agent guessed O2038.
    assert failed == [28]


@pytest.mark.parametrize(
    ("done_line", "last_observation", "expected"),
    [
        ("4 passed, 0 failed", "4 passed, 0 failed\n", True),
        ("4 passed, 0 failed", "3 passed, 1 failed\n", False),
        # The evidence is a whole line: a count inside a listing is not the count printed alone.
        ("7", "logs/api.log:7\nlogs/auth.log:2\n", False),
        ("7", "7\n", True),
        (r"(\d+:|> )?port = 9090", "3:port = 9090\n", True),
        (r"(\d+:|> )?port = 9090", "3c3\n< port = 8000\n---\n> port = 9090\n", True),
        (r"(\d+:|> )?port = 9090", "port = 90901\n", False),
        ("0", "", False),
    ],
)
def test_shell_goal_reads_the_last_observation_by_whole_lines(done_line, last_observation, expected):
    assert ShellGoal(done_line)([("ls", "0\n"), ("command", last_observation)]) is expected


GOALS_HISTORIES = {
    "heated and put": [
        ("take egg 2 from fridge 1", "You pick up the egg 2 from the fridge 1."),
        ("heat egg 2 with microwave 1", "You heat the egg 2 using the microwave 1."),
        ("put egg 2 in/on countertop 1", "You put the egg 2 in/on the countertop 1."),
    ],
    "put, not heated": [
        ("take egg 2 from fridge 1", "You pick up the egg 2 from the fridge 1."),
        ("put egg 2 in/on countertop 1", "You put the egg 2 in/on the countertop 1."),
    ],
    "heated, put, taken back": [
        ("take egg 2 from fridge 1", "You pick up the egg 2 from the fridge 1."),
        ("heat egg 2 with microwave 1", "You heat the egg 2 using the microwave 1."),
        ("put egg 2 in/on countertop 1", "You put the egg 2 in/on the countertop 1."),
        ("take egg 2 from countertop 1", "You pick up the egg 2 from the countertop 1."),
    ],
    # The action says put; the observation says nothing happened: the observation decides.
    "refused": [("put egg 2 in/on countertop 1", "Nothing happens.")],
    "lamp on, holding the book": [
        ("take book 1 from desk 1", "You pick up the book 1 from the desk 1."),
        ("use desklamp 1", "You turn on the desklamp 1."),
    ],
    "lamp on, hands empty": [("use desklamp 1", "You turn on the desklamp 1.")],
}


@pytest.mark.parametrize(
    ("goal", "history", "expected"),
    [
        (HouseholdGoal("heat", "egg", "countertop"), "heated and put", True),
        (HouseholdGoal("heat", "egg", "countertop"), "put, not heated", False),
        (HouseholdGoal("pick", "egg", "countertop"), "put, not heated", True),
        (HouseholdGoal("pick", "egg", "diningtable"), "put, not heated", False),
        (HouseholdGoal("pick", "eggplant", "countertop"), "put, not heated", False),
        (HouseholdGoal("heat", "egg", "countertop"), "heated, put, taken back", False),
        (HouseholdGoal("pick", "egg", "countertop"), "refused", False),
        (HouseholdGoal("look", "book", None), "lamp on, holding the book", True),
        (HouseholdGoal("look", "book", None), "lamp on, hands empty", False),
    ],
)
def test_household_goal_is_what_the_observations_show_the_agent_did(goal, history, expected):
    assert goal(GOALS_HISTORIES[history]) is expected


def call(name: str, reply: object, **arguments: object) -> tuple[str, str]:
    return json.dumps({"name": name, "arguments": arguments}), json.dumps(reply)


ORDER = {"order_id": "O2041", "customer_id": "C1003", "status": "pending", "placed_on": "2024-05-15", "discount": 0.0}
LINE = {"book_id": "B104", "title": "The Salt River", "quantity": 2, "unit_price": 12.5}
ERROR = {"error": {"code": "invalid_status", "message": "order 'O2011' is shipped and cannot be cancelled"}}
ADDRESS = {"street": "12 Oak Lane", "city": "Austin", "postal_code": "78701", "country": "USA"}


@pytest.mark.parametrize(
    ("goal", "history", "expected"),
    [
        (OrderPlaced("C1003", (("B104", 2),), False), [call("create_order", {**ORDER, "items": [LINE]})], True),
        # A simulator may number the new order and date it otherwise: those are the service's to make up.
        (
            OrderPlaced("C1003", (("B104", 2),), False),
            [call("create_order", {**ORDER, "order_id": "O9999", "placed_on": "2031-01-01", "items": [LINE]})],
            True,
        ),
        (OrderPlaced("C1003", (("B104", 3),), False), [call("create_order", {**ORDER, "items": [LINE]})], False),
        (OrderPlaced("C1003", (("B104", 2),), True), [call("create_order", {**ORDER, "items": [LINE]})], False),
        (OrderPlaced("C1004", (("B104", 2),), False), [call("create_order", {**ORDER, "items": [LINE]})], False),
        (OrderPlaced("C1003", (("B104", 2),), False), [call("get_order", {**ORDER, "items": [LINE]})], False),
        (OrderPlaced("C1003", (("B104", 2),), False), [("not a call", "not JSON")], False),
        (
            OrderChanged("cancel_order", "O2011"),
            [call("cancel_order", {"order_id": "O2011", "status": "cancelled"})],
            True,
        ),
        (OrderChanged("cancel_order", "O2011"), [call("cancel_order", ERROR, order_id="O2011")], False),
        (OrderRefused("cancel_order", "O2011"), [call("cancel_order", ERROR, order_id="O2011")], True),
        (OrderRefused("cancel_order", "O2011"), [call("cancel_order", ERROR, order_id="O2012")], False),
        (
            OrderChanged("update_shipping_address", "O2011", ADDRESS),
            [call("update_shipping_address", {"order_id": "O2011", "shipping_address": ADDRESS})],
            True,
        ),
        (
            OrderChanged("update_shipping_address", "O2011", ADDRESS),
            [call("update_shipping_address", {"order_id": "O2011", "shipping_address": {**ADDRESS, "city": "Reno"}})],
            False,
        ),
        (
            OrderShown("C1003", "O2030"),
            [
                call("list_orders", {"orders": []}, customer_id="C1003"),
                call("get_order", {**ORDER, "order_id": "O2030"}),
            ],
            True,
        ),
        (OrderShown("C1003", "O2030"), [call("get_order", {**ORDER, "order_id": "O2030"})], False),
        (
            ReturnOpened("O2012"),
            [call("request_return", {"return_id": "R7-9", "order_id": "O2012", "status": "return_label_sent"})],
            True,
        ),
        (
            GenreListed("poetry", ("B101", "B102"), "B102"),
            [
                call("search_books", {"results": [{"book_id": "B101"}, {"book_id": "B102"}]}, genre="poetry"),
                call("get_book", {"book_id": "B102", "stock": 3}),
            ],
            True,
        ),
        (
            GenreListed("poetry", ("B101", "B102"), "B102"),
            [
                call("search_books", {"results": [{"book_id": "B101"}]}, genre="poetry"),
                call("get_book", {"book_id": "B102", "stock": 3}),
            ],
            False,
        ),
        (
            ResultsShown("Tide"),
            [
                call(
                    "search_books",
                    {"error": {"code": "invalid_page", "message": "page 3 is out of range (1-1)"}},
                    query="Tide",
                    page=3,
                ),
                call("search_books", {"results": [{"book_id": "B117"}]}, query="Tide"),
                call("get_book", {"book_id": "B117", "stock": 0}),
            ],
            True,
        ),
        (ResultsShown("Tide"), [call("get_book", {"book_id": "B117", "stock": 0})], False),
    ],
)
def test_bookstore_goals_read_the_replies_not_the_run_time_ids(goal, history, expected):
    assert goal(history) is expected


def test_the_bookstore_answers_what_is_not_a_tool_call_with_an_error():
    env = BookstoreEnv()
    env.reset(seed=0)
    for action in ["ls -1", '{"name": "get_book"}', '["get_book"]', '{"name": "get_book", "arguments": "B104"}']:
        reply = json.loads(env.step(action)[0])
        assert reply["error"]["code"] in ("invalid_call", "invalid_arguments"), action
    assert (
        json.loads(env.step('{"name": "get_book", "arguments": {"book_id": "B999"}}')[0])["error"]["code"]
        == "not_found"
    )


def test_the_terminal_sandbox_is_replaced_on_reset_and_removed_on_close():
    env = TerminalEnv()
    env.reset(seed=0)
    first = env.sandbox.root
    assert (first / "home" / "user" / "work" / "notes.txt").is_file()
    env.reset(seed=1)
    second = env.sandbox.root
    assert not first.exists() and second.exists()
    env.close()
    assert not second.exists() and env.sandbox is None
    env.close()  # closing twice is allowed (gymnasium's checker asks it)
