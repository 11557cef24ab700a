"""The household games the demo corpus deals (data/demo/text_games/): the scripted player that plays
them, and the builder's choice of game for each index.

Game `index` is drawn from `random.Random(f"text-game-{index}-{attempt}")`, attempt 0 first; the
builder keeps the first draw whose scripted play lasts at least MIN_GAME_ACTIONS actions, since a
shorter game is not worth a log (it removes most games whose goal already holds when dealt: the
player finds the object in place and is done in a few actions). So the deal of a game is
not `new_game` alone but this choice, and an environment that deals as the corpus does
(household_env.py) replays it here.
"""

import random
import re
from dataclasses import dataclass

from pipeline.environments.household import ROOMS, TOOL_FOR, GameTask, Household, new_game

MAX_GAME_ACTIONS = 20
MIN_GAME_ACTIONS = 6


class OutOfActions(Exception):
    pass


def play(game: Household, task: GameTask, rng: random.Random) -> list[tuple[str, str]]:
    """A scripted player that reads the observations: it searches the likely receptacles first,
    opens what is closed, takes the first matching object it sees, then transforms and places it.
    Now and then it explores or tries something that does nothing, as real agents do. It stops at
    MAX_GAME_ACTIONS, done or not."""
    steps: list[tuple[str, str]] = []

    def act(action: str) -> str:
        if len(steps) >= MAX_GAME_ACTIONS:
            raise OutOfActions
        observation = game.step(action)
        steps.append((action, observation))
        return observation

    def go(receptacle: str) -> None:
        if game.location != receptacle and act(f"go to {receptacle}").endswith("is closed."):
            act(f"open {receptacle}")

    def wander() -> None:
        roll = rng.random()
        if roll < 0.06:
            act("inventory")
        elif roll < 0.10:
            act("look")
        elif roll < 0.16:
            act(f"take {task.target_object} 1 from {game.location}")
        elif roll < 0.20:
            act(f"go to {rng.choice(['armchair 1', 'sofa 1', 'bathtubbasin 1', 'cabinet 9', 'safe 1'])}")

    likely_kinds = ROOMS[task.room][1][task.target_object]
    likely = [r for r in sorted(game.contents) if r.rsplit(" ", 1)[0] in likely_kinds]
    others = [r for r in sorted(game.contents) if r not in likely]
    rng.shuffle(likely)
    rng.shuffle(others)
    try:
        for receptacle in likely + others:
            go(receptacle)
            seen = re.findall(rf"\b{task.target_object} \d+", game.describe(receptacle))
            if seen:
                act(f"take {seen[0]} from {receptacle}")
                break
            if receptacle in game.opened and rng.random() < 0.3:
                act(f"close {receptacle}")
            wander()
        held = game.holding
        if held is None:
            return steps
        if task.kind in TOOL_FOR:
            tool = TOOL_FOR[task.kind]
            if rng.random() < 0.15:
                act(f"{task.kind} {held} with {tool}")
            if game.location != tool:
                act(f"go to {tool}")
            act(f"{task.kind} {held} with {tool}")
        if task.kind == "look":
            go(next(r for r, things in sorted(game.contents.items()) if game.lamp in things))
            act(f"use {game.lamp}")
            return steps
        target = rng.choice([r for r in sorted(game.contents) if r.startswith(f"{task.target_receptacle} ")])
        if rng.random() < 0.15:
            act(f"put {held} in/on {target}")
        go(target)
        act(f"put {held} in/on {target}")
    except OutOfActions:
        pass
    return steps


@dataclass(frozen=True)
class PlayedGame:
    """Game `index` of the corpus as its scripted player left it: the draw kept, the opening, the steps."""

    attempt: int
    game: Household  # after the play
    task: GameTask
    intro: str
    steps: list[tuple[str, str]]


def played_game(index: int) -> PlayedGame:
    """Game `index`, played; a draw too short to be worth a game is redrawn."""
    attempt = 0
    while True:
        rng = random.Random(f"text-game-{index}-{attempt}")
        game, task = new_game(rng)
        intro = game.intro()
        steps = play(game, task, rng)
        if len(steps) >= MIN_GAME_ACTIONS:
            return PlayedGame(attempt, game, task, intro, steps)
        attempt += 1


def dealt_game(index: int) -> tuple[Household, GameTask]:
    """Game `index` as the corpus deals it, before any action."""
    return new_game(random.Random(f"text-game-{index}-{played_game(index).attempt}"))
