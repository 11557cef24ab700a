"""The text-game engine: an ALFWorld-like household (kitchen, bathroom or bedroom) whose receptacles
open and close, whose objects can be taken, put, cleaned, heated and cooled, and a desk lamp; plus
the deal of a game (a room laid out from a seed, and a task in it) and the check that it is won."""

import random
from dataclasses import dataclass

# Room -> (receptacle type -> (fewest, most, openable?); object type -> receptacle types it is found in).
ROOMS = {
    "kitchen": (
        {
            "cabinet": (3, 8, True),
            "countertop": (1, 2, False),
            "drawer": (1, 3, True),
            "fridge": (1, 1, True),
            "microwave": (1, 1, True),
            "sinkbasin": (1, 1, False),
            "stoveburner": (2, 4, False),
            "diningtable": (1, 1, False),
            "garbagecan": (1, 1, False),
            "coffeemachine": (1, 1, False),
            "toaster": (1, 1, False),
            "shelf": (1, 2, False),
        },
        {
            "apple": ["countertop", "diningtable", "fridge", "garbagecan"],
            "mug": ["cabinet", "coffeemachine", "countertop", "shelf"],
            "cup": ["cabinet", "countertop", "diningtable", "fridge"],
            "potato": ["fridge", "countertop", "garbagecan"],
            "egg": ["fridge", "countertop", "diningtable"],
            "lettuce": ["fridge", "diningtable", "countertop"],
            "tomato": ["fridge", "countertop", "diningtable"],
            "plate": ["cabinet", "countertop", "diningtable"],
            "bowl": ["cabinet", "shelf", "diningtable"],
            "knife": ["drawer", "countertop", "diningtable"],
            "spoon": ["drawer", "diningtable", "countertop"],
            "pan": ["stoveburner", "cabinet", "countertop"],
            "bread": ["countertop", "diningtable"],
        },
    ),
    "bathroom": (
        {
            "cabinet": (2, 4, True),
            "countertop": (1, 1, False),
            "drawer": (1, 3, True),
            "sinkbasin": (1, 2, False),
            "toilet": (1, 1, False),
            "towelholder": (1, 1, False),
            "garbagecan": (1, 1, False),
            "shelf": (1, 2, False),
        },
        {
            "soapbar": ["countertop", "sinkbasin", "cabinet", "toilet"],
            "cloth": ["cabinet", "countertop", "drawer"],
            "spraybottle": ["cabinet", "toilet", "shelf"],
            "toiletpaper": ["cabinet", "shelf", "toilet"],
            "candle": ["countertop", "shelf", "cabinet"],
            "towel": ["towelholder", "countertop"],
        },
    ),
    "bedroom": (
        {
            "desk": (1, 1, False),
            "sidetable": (1, 2, False),
            "drawer": (2, 5, True),
            "shelf": (1, 3, False),
            "bed": (1, 1, False),
            "dresser": (1, 1, False),
            "garbagecan": (1, 1, False),
        },
        {
            "book": ["desk", "bed", "shelf", "sidetable"],
            "cd": ["drawer", "desk", "shelf"],
            "cellphone": ["bed", "desk", "sidetable", "dresser"],
            "keychain": ["drawer", "dresser", "sidetable"],
            "pen": ["desk", "drawer", "sidetable"],
            "alarmclock": ["desk", "sidetable", "dresser"],
            "creditcard": ["drawer", "desk", "dresser"],
            "pillow": ["bed"],
        },
    ),
}
CLEANABLE = {
    "apple",
    "mug",
    "cup",
    "potato",
    "lettuce",
    "tomato",
    "plate",
    "bowl",
    "knife",
    "spoon",
    "pan",
    "soapbar",
    "cloth",
}
HEATABLE = {"apple", "mug", "cup", "potato", "egg", "tomato", "plate", "bread"}
COOLABLE = {"apple", "mug", "cup", "potato", "lettuce", "tomato", "plate", "bowl", "pan", "bread"}
LAMP_LOOKABLE = {"book", "cd", "cellphone", "keychain", "pen", "alarmclock", "creditcard"}
TARGETS = {
    "kitchen": ["cabinet", "countertop", "diningtable", "shelf", "fridge", "drawer"],
    "bathroom": ["cabinet", "countertop", "shelf", "toilet", "garbagecan", "drawer"],
    "bedroom": ["desk", "shelf", "dresser", "sidetable", "drawer", "bed"],
}
NOTHING = "Nothing happens."
# What each transforming verb does to an object, and the appliance it needs.
STATE_FOR = {"clean": "clean", "heat": "hot", "cool": "cool"}
TOOL_FOR = {"clean": "sinkbasin 1", "heat": "microwave 1", "cool": "fridge 1"}


def a_list(items: list[str]) -> str:
    """ALFWorld's listing: "a x 1", "a x 1, and a y 2", "a x 1, a y 2, and a z 3"."""
    named = [f"a {item}" for item in items]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + ", and " + named[-1]


def instance_key(name: str) -> tuple[str, int]:
    kind, number = name.rsplit(" ", 1)
    return kind, -int(number)


class Household:
    """The text-game engine: receptacles that may open and close, objects to take, put, clean, heat
    and cool, a desk lamp to switch on. Any action it cannot carry out answers "Nothing happens."."""

    def __init__(self, contents: dict[str, list[str]], openable: set[str], lamp: str | None):
        self.contents = contents
        self.openable = openable
        self.opened: set[str] = set()
        self.lamp = lamp
        self.lamp_on = False
        self.location: str | None = None
        self.holding: str | None = None
        self.states: dict[str, set[str]] = {}

    def intro(self) -> str:
        everything = sorted(self.contents, key=instance_key)
        return f"You are in the middle of a room. Looking quickly around you, you see {a_list(everything)}."

    def describe(self, receptacle: str) -> str:
        things = a_list(self.contents[receptacle]) if self.contents[receptacle] else "nothing"
        if receptacle in self.openable:
            if receptacle not in self.opened:
                return f"The {receptacle} is closed."
            return f"The {receptacle} is open. In it, you see {things}."
        return f"On the {receptacle}, you see {things}."

    def reachable(self, receptacle: str) -> bool:
        return self.location == receptacle and (receptacle not in self.openable or receptacle in self.opened)

    def step(self, action: str) -> str:
        words = action.split()
        verb = words[0] if words else ""
        rest = " ".join(words[1:])
        if action == "look":
            if self.location is None:
                return "You are in the middle of a room. Looking quickly around you, you see nothing."
            return f"You are facing the {self.location}. Next to it, you see nothing."
        if action == "inventory":
            return f"You are carrying: a {self.holding}." if self.holding else "You are not carrying anything."
        if verb == "go" and rest.startswith("to ") and rest[3:] in self.contents and rest[3:] != self.location:
            self.location = rest[3:]
            return self.describe(self.location)
        if verb in ("open", "close") and rest == self.location and rest in self.openable:
            if (verb == "open") == (rest in self.opened):
                return NOTHING
            if verb == "close":
                self.opened.discard(rest)
                return f"You close the {rest}."
            self.opened.add(rest)
            return f"You open the {rest}. " + self.describe(rest)
        if verb == "examine" and rest == self.location:
            return self.describe(rest)
        if verb == "take" and " from " in rest and self.holding is None:
            thing, source = rest.split(" from ", 1)
            if self.reachable(source) and thing in self.contents[source]:
                self.contents[source].remove(thing)
                self.holding = thing
                return f"You pick up the {thing} from the {source}."
        if verb == "put" and " in/on " in rest:
            thing, target = rest.split(" in/on ", 1)
            if thing == self.holding and self.reachable(target):
                self.contents[target].append(thing)
                self.holding = None
                return f"You put the {thing} in/on the {target}."
        if verb in STATE_FOR and " with " in rest:
            thing, using = rest.split(" with ", 1)
            if thing == self.holding and using == self.location and using.startswith(TOOL_FOR[verb].split()[0]):
                self.states.setdefault(thing, set()).add(STATE_FOR[verb])
                return f"You {verb} the {thing} using the {using}."
        if verb == "use" and rest == self.lamp and self.lamp in self.contents.get(self.location or "", []):
            self.lamp_on = True
            return f"You turn on the {rest}."
        return NOTHING


@dataclass
class GameTask:
    room: str
    kind: str  # pick | clean | heat | cool | look
    target_object: str
    target_receptacle: str | None
    text: str


def task_text(kind: str, thing: str, target: str | None, rng: random.Random) -> str:
    options = {
        "pick": [f"put a {thing} in {target}.", f"put some {thing} on {target}."],
        "clean": [f"put a clean {thing} in {target}.", f"clean some {thing} and put it in {target}."],
        "heat": [f"put a hot {thing} in {target}.", f"heat some {thing} and put it in {target}."],
        "cool": [f"put a cool {thing} in {target}.", f"cool some {thing} and put it in {target}."],
        "look": [f"look at {thing} under the desklamp.", f"examine the {thing} with the desklamp."],
    }
    return rng.choice(options[kind])


def goal_met(game: Household, task: GameTask) -> bool:
    if task.kind == "look":
        return game.lamp_on and (game.holding or "").startswith(task.target_object + " ")
    wanted = STATE_FOR.get(task.kind)
    return any(
        thing.startswith(task.target_object + " ") and (wanted is None or wanted in game.states.get(thing, set()))
        for receptacle, things in game.contents.items()
        if receptacle.startswith(f"{task.target_receptacle} ")
        for thing in things
    )


def new_game(rng: random.Random) -> tuple[Household, GameTask]:
    room = rng.choice(sorted(ROOMS))
    receptacle_kinds, objects = ROOMS[room]
    contents: dict[str, list[str]] = {}
    openable = set()
    for kind in sorted(receptacle_kinds):
        low, high, opens = receptacle_kinds[kind]
        for number in range(1, rng.randint(low, high) + 1):
            contents[f"{kind} {number}"] = []
            if opens:
                openable.add(f"{kind} {number}")
    for thing in sorted(objects):
        for number in range(1, rng.randint(1, 3) + 1):
            places = [r for r in sorted(contents) if r.rsplit(" ", 1)[0] in objects[thing]]
            contents[rng.choice(places)].append(f"{thing} {number}")
    lamp = None
    if room == "bedroom":
        lamp = "desklamp 1"
        contents[rng.choice([r for r in sorted(contents) if r.startswith(("desk", "sidetable"))])].append(lamp)
    pools = {"pick": set(objects) - {"pillow"}, "clean": CLEANABLE & set(objects)}
    if room == "kitchen":
        pools.update(heat=HEATABLE & set(objects), cool=COOLABLE & set(objects))
    if lamp:
        pools["look"] = LAMP_LOOKABLE & set(objects)
    kind = rng.choice(sorted(k for k, pool in pools.items() if pool))
    thing = rng.choice(sorted(pools[kind]))
    target = None if kind == "look" else rng.choice([t for t in TARGETS[room] if f"{t} 1" in contents])
    for receptacle in contents.values():
        receptacle.sort(key=instance_key)
    return Household(contents, openable, lamp), GameTask(room, kind, thing, target, task_text(kind, thing, target, rng))
