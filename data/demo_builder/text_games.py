"""Text-game logs: the scripted player (pipeline/environments/household_player.py) plays games the
household engine deals, and each game is written as TextWorld / ALFWorld harnesses log it: intro,
task line, then `> action` and observation."""

from pipeline.environments.household import goal_met
from pipeline.environments.household_player import played_game


def text_game_log(index: int) -> tuple[str, str, bool]:
    """(task kind, log text, solved) for game `index`."""
    played = played_game(index)
    lines = [played.intro, f"Your task is to: {played.task.text}"]
    lines += [f"> {action}\n{observation}" for action, observation in played.steps]
    return played.task.kind, "\n".join(lines) + "\n", goal_met(played.game, played.task)
