"""The household text game as a gymnasium environment (issue 31, deliver 2): the corpus's engine,
games dealt as the corpus deals them (household_player.py), and the game's success check read from
the observations.

    env = HouseholdEnv()
    observation, info = env.reset(seed=3)   # the intro and "Your task is to: ..." of the corpus's game 3
    observation, reward, terminated, truncated, info = env.step("go to toilet 1")

As data/demo/text_games/ presents a game once ingested (pipeline/formats/text_game.py): domain
`text-game`, the task the text of the `Your task is to:` line, and the system prompt's one part the
initial state, which is the intro and that line.

Success (`HouseholdGoal`) is the engine's goal (household.py `goal_met`) as the observations show it:
an object of the task's kind that the agent put in/on a receptacle of the task's kind (the
observation "You put the X in/on the Y."), cleaned, heated or cooled on the way where the task asks
("You clean the X using the Y."), or, for a look task, the desk lamp switched on while the agent
holds such an object. Only what the agent did counts: the initial observation does not say what lies
where, so a game whose goal already holds when dealt (none of the corpus's 100 games, 72 of seeds 0-999)
is won when the agent places an object, as the solution does, not from the start as `goal_met` has it.

The solution goes straight to the first object of the task's kind (the engine's ground truth), opens
what is closed, takes it, carries it to the appliance, then to receptacle 1 of the target kind, and
puts it there. The vocabulary is ALFWorld's command templates over this room's receptacles and the
objects of the task's kind.
"""

import re
from dataclasses import dataclass
from typing import Any

from pipeline.environments.base import RealEnvironment
from pipeline.environments.household import STATE_FOR, TOOL_FOR, GameTask, Household, instance_key
from pipeline.environments.household_player import MAX_GAME_ACTIONS, dealt_game
from pipeline.environments.task import History, TaskSpec
from pipeline.store.schema import SystemPrompt

DOMAIN = "text-game"
PICKED = re.compile(r"You pick up the (.+) from the (.+)\.")
PUT = re.compile(r"You put the (.+) in/on the (.+)\.")
CHANGED = re.compile(r"You (clean|heat|cool) the (.+) using the (.+)\.")
LAMP_ON = re.compile(r"You turn on the (.+)\.")


def kind_of(name: str) -> str:
    """ "apple 2" -> "apple": the engine names every instance `<kind> <number>`."""
    return name.rsplit(" ", 1)[0]


@dataclass(frozen=True)
class HouseholdGoal:
    kind: str  # pick | clean | heat | cool | look
    target_object: str
    target_receptacle: str | None

    def __call__(self, history: History) -> bool:
        holding: str | None = None
        placed: dict[str, str] = {}  # object -> the receptacle the agent put it in/on
        states: dict[str, set[str]] = {}
        lamp_on = False
        for _, observation in history:
            text = observation.strip()
            if picked := PICKED.fullmatch(text):
                holding = picked[1]
                placed.pop(holding, None)
            elif put := PUT.fullmatch(text):
                placed[put[1]] = put[2]
                holding = None
            elif changed := CHANGED.fullmatch(text):
                states.setdefault(changed[2], set()).add(STATE_FOR[changed[1]])
            elif LAMP_ON.fullmatch(text):
                lamp_on = True
        if self.kind == "look":
            return lamp_on and holding is not None and kind_of(holding) == self.target_object
        wanted = STATE_FOR.get(self.kind)
        return any(
            kind_of(thing) == self.target_object
            and kind_of(receptacle) == self.target_receptacle
            and (wanted is None or wanted in states.get(thing, set()))
            for thing, receptacle in placed.items()
        )


def solution(game: Household, task: GameTask) -> list[str]:
    """The shortest plan the engine accepts, from its ground truth: where the object lies, what opens."""
    plan: list[str] = []
    location: str | None = None
    opened: set[str] = set()

    def go(receptacle: str, open_it: bool = True) -> None:
        nonlocal location
        if location != receptacle:  # the engine answers a move to where the agent stands "Nothing happens."
            plan.append(f"go to {receptacle}")
            location = receptacle
        if open_it and receptacle in game.openable and receptacle not in opened:
            plan.append(f"open {receptacle}")
            opened.add(receptacle)

    source, thing = next(
        (receptacle, thing)
        for receptacle in sorted(game.contents, key=instance_key)
        for thing in game.contents[receptacle]
        if kind_of(thing) == task.target_object
    )
    go(source)
    plan.append(f"take {thing} from {source}")
    if task.kind in TOOL_FOR:
        # The appliance works closed ("heat the egg with microwave 1" needs the agent there, not the door open).
        go(TOOL_FOR[task.kind], open_it=False)
        plan.append(f"{task.kind} {thing} with {TOOL_FOR[task.kind]}")
    if task.kind == "look":
        go(next(r for r, things in game.contents.items() if game.lamp in things))
        plan.append(f"use {game.lamp}")
        return plan
    target = f"{task.target_receptacle} 1"
    go(target)
    plan.append(f"put {thing} in/on {target}")
    return plan


def vocabulary(game: Household, task: GameTask) -> list[str]:
    """ALFWorld's command templates over this room's receptacles and the objects of the task's kind."""
    receptacles = sorted(game.contents, key=instance_key)
    things = sorted(
        (t for ts in game.contents.values() for t in ts if kind_of(t) == task.target_object), key=instance_key
    )
    tools = [tool for tool in TOOL_FOR.values() if tool in game.contents]
    actions = ["look", "inventory"]
    actions += [f"{verb} {r}" for r in receptacles for verb in ("go to", "examine")]
    actions += [f"{verb} {r}" for r in receptacles if r in game.openable for verb in ("open", "close")]
    actions += [f"take {t} from {r}" for t in things for r in receptacles]
    actions += [f"put {t} in/on {r}" for t in things for r in receptacles]
    actions += [f"{verb} {t} with {tool}" for t in things for verb, tool in TOOL_FOR.items() if tool in tools]
    if game.lamp:
        actions.append(f"use {game.lamp}")
    return actions


def household_spec(game: Household, task: GameTask) -> TaskSpec:
    """The TaskSpec of a freshly dealt game (before any action: its plan reads where things lie)."""
    return TaskSpec(
        domain=DOMAIN,
        task=task.text,
        system=SystemPrompt(initial_state=f"{game.intro()}\nYour task is to: {task.text}"),
        success=HouseholdGoal(task.kind, task.target_object, task.target_receptacle),
        solution=tuple(solution(game, task)),
        vocabulary=tuple(vocabulary(game, task)),
        # The corpus's action budget: its scripted player stops there.
        max_steps=MAX_GAME_ACTIONS,
    )


def household_task(index: int) -> TaskSpec:
    """Task `index` as the corpus deals it (the corpus's game `index` for index < 100)."""
    return household_spec(*dealt_game(index))


class HouseholdEnv(RealEnvironment):
    household: Household
    game_task: GameTask

    def deal(self, index: int) -> TaskSpec:
        self.household, self.game_task = dealt_game(index)
        return household_spec(self.household, self.game_task)

    def run(self, action: str) -> tuple[str, dict[str, Any]]:
        return self.household.step(action), {}
