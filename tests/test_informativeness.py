"""Word sets, the four metrics and the categories: tables at the thresholds, real turns, bulk = Python."""

import json
import random
import unicodedata
from pathlib import Path

import polars as pl
import pytest

from pipeline.config.score import ScoreConfig
from pipeline.informativeness import TurnMetrics, score_frame, score_turn, turn_metrics, word_lists, word_set

DEFAULT = ScoreConfig()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Hello World", {"hello", "world"}),
        ("a a A", {"a"}),  # de-duplicated after lower-casing
        ('{"user_id": 42}', {"user_id", "42"}),  # JSON keys are words, quotes and braces are not
        ("x_1 __init__", {"x_1", "__init__"}),  # underscores stay inside words
        ("cat src/app/main.py", {"cat", "src", "app", "main", "py"}),  # paths and dotted names split
        ("mia.li3818@example.com", {"mia", "li3818", "example", "com"}),
        ("3.14 on 2024-05-15", {"3", "14", "on", "2024", "05", "15"}),  # numbers are words, split at . and -
        ("don't STOP", {"don", "t", "stop"}),
        ("tab\tnew\nline", {"tab", "new", "line"}),
        ("", set()),
        ("{} [] --- ...", set()),  # punctuation only: no words
        ("emoji 🚀 rocket", {"emoji", "rocket"}),  # symbols separate words
        ("Café NAÏVE", {"café", "naïve"}),
        ("東京 タワー", {"東京", "タワー"}),
        ("½ ⅻ ١٢٣", {"½", "ⅻ", "١٢٣"}),  # every Unicode number
        ("ΟΔΟΣ", {"οδοσ"}),  # per-character lower-casing: no final-sigma rule
        ("İstanbul", {"istanbul"}),
        ("e\u0301t\u00e9", {"e", "té"}),  # a combining mark separates
    ],
)
def test_word_set(text: str, words: set[str]) -> None:
    assert word_set(text) == words
    assert set(bulk_words([text])[0]) == words


def bulk_words(texts: list[str]) -> list[list[str]]:
    frame = pl.DataFrame({"text": texts}, schema={"text": pl.String})
    return frame.select(word_lists(pl.col("text")))["text"].to_list()


def test_bulk_words_match_python_on_every_code_point() -> None:
    """Each code point between a capital and a final capital sigma: whether it is a letter or number,
    its lower case, and whether it splits a word. Python 3.11 knows Unicode 14, polars 2.1's regex
    crate Unicode 16: the code points assigned in between are the only ones that differ, a letter or
    number in polars (one word) and unassigned to Python (a separator between two)."""
    points = [p for p in range(0x110000) if not 0xD800 <= p <= 0xDFFF]  # surrogates are not text
    texts = [f"A{chr(p)}Σ" for p in points]
    bulk = bulk_words(texts)
    differ = [(p, words) for p, text, words in zip(points, texts, bulk, strict=True) if set(words) != word_set(text)]
    assert all(unicodedata.category(chr(p)) == "Cn" and len(words) == 1 for p, words in differ)
    cjk_extension_h = "A\U00031350Σ"
    assert word_set(cjk_extension_h) == {"a", "σ"} and bulk_words([cjk_extension_h]) == [["a\U00031350σ"]]
    assert len(differ) == 9394


def words(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:02d}" for i in range(n)]


def pair(action_words: int, shared: int, new: int, action_chars: int, observation_chars: int) -> tuple[str, str]:
    """An action of `action_words` words and an observation with the first `shared` of them and `new`
    others, each padded with '.' (no word) to the given length: word sets and R set independently."""
    action = " ".join(words("a", action_words))
    observation = " ".join(words("a", shared) + words("n", new))
    assert len(action) <= action_chars and len(observation) <= observation_chars, "padding cannot shorten"
    return action.ljust(action_chars, "."), observation.ljust(observation_chars, ".")


# (why, (action, observation), (OL, Nov, Jac, R), category). Paper's thresholds: echo OL >= 0.7 and
# Nov < 0.3; boilerplate OL >= 0.5 and Nov < 0.5; transform Nov < 0.5 and R < 1; expansion OL >= 0.5,
# Nov >= 0.5, R > 1.5; retrieval Nov >= 0.6 and R > 1; action Nov >= 0.5 and (R <= 1 or <= 80 chars).
THRESHOLDS = [
    ("echo inside", pair(10, 10, 0, 100, 100), (1.0, 0.0, 1.0, 1.0), "echo"),
    ("echo on OL 0.7", pair(10, 7, 2, 100, 100), (0.7, 2 / 9, 7 / 12, 1.0), "echo"),
    ("echo just under OL 0.7 -> boilerplate", pair(100, 69, 2, 400, 400), (0.69, 2 / 71, 69 / 102, 1.0), "boilerplate"),
    ("echo just under Nov 0.3", pair(20, 20, 8, 200, 200), (1.0, 8 / 28, 20 / 28, 1.0), "echo"),
    ("echo on Nov 0.3 -> boilerplate", pair(10, 7, 3, 100, 100), (0.7, 0.3, 7 / 13, 1.0), "boilerplate"),
    ("boilerplate on OL 0.5", pair(10, 5, 4, 100, 100), (0.5, 4 / 9, 5 / 14, 1.0), "boilerplate"),
    (
        "boilerplate just under OL 0.5, R < 1 -> transform",
        pair(10, 4, 2, 100, 99),
        (0.4, 2 / 6, 4 / 12, 0.99),
        "transform",
    ),
    ("boilerplate just under OL 0.5, R on 1 -> other", pair(10, 4, 2, 100, 100), (0.4, 2 / 6, 4 / 12, 1.0), "other"),
    ("transform inside", pair(10, 4, 3, 100, 50), (0.4, 3 / 7, 4 / 13, 0.5), "transform"),
    ("transform on Nov 0.5 -> action", pair(10, 2, 2, 100, 50), (0.2, 0.5, 2 / 12, 0.5), "action"),
    (
        "boilerplate on Nov 0.5, R just over 1.5 -> expansion",
        pair(10, 5, 5, 100, 151),
        (0.5, 0.5, 5 / 15, 1.51),
        "expansion",
    ),
    ("expansion on R 1.5, long -> other", pair(10, 5, 5, 60, 90), (0.5, 0.5, 5 / 15, 1.5), "other"),
    ("expansion inside", pair(10, 8, 20, 100, 300), (0.8, 20 / 28, 8 / 30, 3.0), "expansion"),
    ("expansion just under OL 0.5 -> retrieval", pair(10, 4, 20, 100, 300), (0.4, 20 / 24, 4 / 30, 3.0), "retrieval"),
    ("retrieval on Nov 0.6, R just over 1", pair(10, 4, 6, 100, 101), (0.4, 0.6, 4 / 16, 1.01), "retrieval"),
    ("retrieval on R 1 -> action", pair(10, 2, 8, 100, 100), (0.2, 0.8, 2 / 18, 1.0), "action"),
    ("retrieval just under Nov 0.6, long -> other", pair(10, 4, 5, 100, 120), (0.4, 5 / 9, 4 / 15, 1.2), "other"),
    ("same, short (60 chars) -> action", pair(10, 4, 5, 50, 60), (0.4, 5 / 9, 4 / 15, 1.2), "action"),
    ("action on the short bound (80 chars)", pair(4, 1, 1, 40, 80), (0.25, 0.5, 1 / 5, 2.0), "action"),
    (
        "action just over the short bound (81 chars) -> other",
        pair(4, 1, 1, 40, 81),
        (0.25, 0.5, 1 / 5, 81 / 40),
        "other",
    ),
    (
        "boilerplate and transform both match: boilerplate first",
        pair(10, 5, 4, 100, 90),
        (0.5, 4 / 9, 5 / 14, 0.9),
        "boilerplate",
    ),
    # Edge cases: a metric with an empty denominator is None and matches no threshold.
    ("empty observation", ("rm notes.txt", ""), (0.0, None, 0.0, 0.0), "other"),
    ("observation without words", ("ls -a", "{}"), (0.0, None, 0.0, 0.4), "other"),
    ("action without words, long observation", ("{}", "found " * 20), (None, 1.0, 0.0, 60.0), "retrieval"),
    ("empty action, short observation", ("", "done"), (None, 1.0, 0.0, None), "action"),
    ("empty action, long observation", ("", "x" * 81), (None, 1.0, 0.0, None), "other"),
    ("no words on either side", ("...", "!!"), (None, None, None, 2 / 3), "other"),
]


def as_tuple(m: TurnMetrics) -> tuple:
    return (m.overlap, m.novelty, m.jaccard, m.length_ratio)


def assert_metrics(values: tuple, expected: tuple) -> None:
    for name, got, want in zip(("overlap", "novelty", "jaccard", "length_ratio"), values, expected, strict=True):
        if want is None:
            assert got is None, name
        else:
            assert got == pytest.approx(want, abs=1e-12), name


@pytest.mark.parametrize(("why", "turn", "metrics", "category"), THRESHOLDS, ids=[row[0] for row in THRESHOLDS])
def test_thresholds(why: str, turn: tuple[str, str], metrics: tuple, category: str) -> None:
    scored = score_turn(*turn, DEFAULT)
    assert_metrics(as_tuple(scored.metrics), metrics)
    assert scored.category == category, why
    assert scored.keep_ratio == DEFAULT.keep_ratios.of(category)


def bulk_scores(
    turns: list[tuple[str, str]],
    config: ScoreConfig,
    kinds: list[str | None] | None = None,
    previous: list[str | None] | None = None,
) -> list[tuple]:
    columns = {
        "trajectory_id": ["t"] * len(turns),
        "turn_index": list(range(len(turns))),
        "action": [a for a, _ in turns],
        "observation": [o for _, o in turns],
        "kind": kinds or [None] * len(turns),
    }
    if previous is not None:
        columns["previous_observation"] = previous
    frame = pl.DataFrame(columns, schema_overrides={"kind": pl.String, "previous_observation": pl.String})
    return score_frame(frame, config).sort("turn_index").rows()


def test_bulk_agrees_on_the_threshold_table() -> None:
    rows = bulk_scores([turn for _, turn, _, _ in THRESHOLDS], DEFAULT)
    for (why, _, metrics, category), row in zip(THRESHOLDS, rows, strict=True):
        assert_metrics(tuple(row[2:6]), metrics)
        assert row[6] == category, why
        assert row[7] == DEFAULT.keep_ratios.of(category)


def test_a_thought_is_its_own_category_whatever_its_metrics() -> None:
    """Issue 13: ReAct's `think:` turns, answered "OK." by the harness, were scored like any turn:
    `action` at keep ratio 1 here. A turn of kind `thought` is `thought`, keep ratio 0 by default
    (configurable), its metrics still computed; another kind changes nothing."""
    think = ("think: To solve the task, I need to find and take a spraybottle.", "OK.")
    assert score_turn(*think, DEFAULT).category == "action"
    scored = score_turn(*think, DEFAULT, kind="thought")
    assert (scored.category, scored.keep_ratio, scored.metrics) == ("thought", 0.0, turn_metrics(*think))
    assert score_turn(*think, DEFAULT, kind="format_error").category == "action"
    assert score_turn(*think, ScoreConfig(keep_ratios={"thought": 0.2}), kind="thought").keep_ratio == 0.2
    rows = bulk_scores([think, think, think], DEFAULT, ["thought", None, "format_error"])
    assert [(row[6], row[7]) for row in rows] == [("thought", 0.0), ("action", 1.0), ("action", 1.0)]
    assert rows[0][2:6] == rows[1][2:6]


def test_a_repeated_observation_is_its_own_category_after_thoughts() -> None:
    """A turn answered exactly as the turn before it (a second silent command, a retried `go to`) is
    `repeat` whatever its metrics, keep ratio 1 by default and configurable; a thought stays a thought,
    a first turn (no previous observation) and a near repeat are scored by their metrics."""
    silent = ("mkdir build", "")
    room = ("go to cabinet 1", "On the cabinet 1, you see a cloth 1.")
    assert score_turn(*silent, DEFAULT).category == "other"
    assert score_turn(*silent, DEFAULT, previous_observation="").category == "repeat"
    assert score_turn(*silent, DEFAULT, previous_observation=None).category == "other"
    scored = score_turn(*room, ScoreConfig(keep_ratios={"repeat": 0.0}), previous_observation=room[1])
    assert (scored.category, scored.keep_ratio, scored.metrics) == ("repeat", 0.0, turn_metrics(*room))
    assert score_turn(*room, DEFAULT, previous_observation=room[1] + " ").category == "expansion"
    assert score_turn(*room, DEFAULT, kind="thought", previous_observation=room[1]).category == "thought"
    config = ScoreConfig(keep_ratios={"repeat": 0.0})
    rows = bulk_scores([silent, silent, room, room], config, previous=[None, "", "x", room[1]])
    assert [(row[6], row[7]) for row in rows] == [("other", 1.0), ("repeat", 0.0), ("expansion", 1.0), ("repeat", 0.0)]
    assert rows[0][2:6] == rows[1][2:6]
    assert [row[6] for row in bulk_scores([silent, silent], config)] == ["other", "other"]  # no column, no repeat


def test_config_decides_precedence_jaccard_and_short() -> None:
    echo_on_bound = pair(10, 7, 2, 100, 100)  # OL 0.7, Nov 0.22, Jac 0.58
    assert score_turn(*echo_on_bound, ScoreConfig(echo_jaccard_min=0.5)).category == "echo"
    assert score_turn(*echo_on_bound, ScoreConfig(echo_jaccard_min=0.6)).category == "boilerplate"
    reordered = ScoreConfig(
        precedence=["boilerplate", "echo", "transform", "expansion", "retrieval", "action", "other"]
    )
    assert score_turn(*pair(10, 10, 0, 100, 100), reordered).category == "boilerplate"
    over_short = pair(4, 1, 1, 40, 81)
    assert score_turn(*over_short, ScoreConfig(short_observation_chars=81)).category == "action"
    assert score_turn(*over_short, ScoreConfig(keep_ratios={"other": 0.3})).keep_ratio == 0.3
    with pytest.raises(ValueError, match="precedence"):
        ScoreConfig(precedence=["echo", "other"])


VOCABULARY = (
    "the a of to is in ls cat grep file files found error ok done user_id name status price 42 7 2024 05 "
    "src app main py json true false null cabinet drawer go take put open Öffnen Straße ΟΔΟΣ İstanbul 東京 "
    "données ½ ⅻ x_1 __init__ Error OK HTTP 404 result results item items"
).split()
SEPARATORS = [" ", " ", " ", "\n", ", ", ": ", ".", "/", "-", '": "', "{", "}", "[", "]", " 🚀 ", "\t", "\u0301"]


def random_text(rng: random.Random, words: list[str], length: int) -> str:
    return "".join(rng.choice(words) + rng.choice(SEPARATORS) for _ in range(length))


def random_turn(rng: random.Random) -> tuple[str, str]:
    """Mixes of echo, rewrite, retrieval and ack turns, with empty and punctuation-only sides."""
    action = random_text(rng, VOCABULARY, rng.choice([0, 1, 2, 3, 5, 8, 13, 40]))
    action_words = action.replace("\n", " ").split() or ["x"]
    kind = rng.random()
    if kind < 0.25:
        observation = random_text(rng, action_words, rng.randint(0, 12))
    elif kind < 0.5:
        observation = random_text(rng, action_words + VOCABULARY, rng.randint(0, 60))
    elif kind < 0.75:
        observation = random_text(rng, VOCABULARY, rng.randint(0, 200))
    else:
        observation = rng.choice(["", "OK.", "{}", "...", "done", "Nothing happens.", action, action.upper()])
    if rng.random() < 0.05:
        action = rng.choice(["", "{}", "  ", "->"])
    return action, observation


CONFIGS = [
    DEFAULT,
    ScoreConfig(echo_jaccard_min=0.8, short_observation_chars=20, transform_ratio_max=1.2),
    ScoreConfig(precedence=["other", "echo", "boilerplate", "transform", "expansion", "retrieval", "action"]),
    ScoreConfig(precedence=["action", "retrieval", "expansion", "transform", "boilerplate", "echo", "other"]),
]


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "jaccard+short", "other-first", "reversed"])
def test_bulk_matches_the_python_reference_on_random_turns(config: ScoreConfig) -> None:
    rng = random.Random(3)
    turns = [random_turn(rng) for _ in range(3000)]
    kinds = [rng.choice([None, None, None, None, "thought", "format_error"]) for _ in turns]
    # The observation before each: none, the turn's own (a repeat), or another turn's.
    previous = [rng.choice([None, observation, rng.choice(turns)[1]]) for _, observation in turns]
    rows = bulk_scores(turns, config, kinds, previous)
    categories = set()
    for turn, kind, before, row in zip(turns, kinds, previous, rows, strict=True):
        expected = score_turn(*turn, config, kind, before)
        m = expected.metrics
        # The same divisions of the same counts: equal to the last bit, None where undefined.
        metrics = (m.overlap, m.novelty, m.jaccard, m.length_ratio)
        assert row[2:] == (*metrics, expected.category, expected.keep_ratio), turn
        categories.add(row[6])
    if config is DEFAULT:  # the random mix reaches every category
        assert categories == {*config.precedence, "thought", "repeat"}


def react_steps(text: str) -> list[tuple[str, str]]:
    """(action, observation) pairs of a ReAct ALFWorld prompt: `> action` lines, each followed by its observation."""
    steps, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("> ") and i + 1 < len(lines) and not lines[i + 1].startswith("> "):
            steps.append((line[2:], lines[i + 1]))
    return steps


def tau_tool_turns(run: dict) -> list[tuple[str, str]]:
    """(`name(arguments)`, tool response) pairs of one tau-bench run."""
    calls, turns = {}, []
    for message in run["traj"]:
        for call in message.get("tool_calls") or []:
            calls[call["id"]] = f"{call['function']['name']}({call['function']['arguments']})"
        if message["role"] == "tool":
            turns.append((calls[message["tool_call_id"]], message["content"]))
    return turns


def test_real_turns_pinned(public_data: Path) -> None:
    """Counted by hand from the files; R is characters(observation) / characters(action)."""
    run = json.loads((public_data / "tau_bench" / "gpt-4o-airline-tasks-00-24.json").read_text())[0]
    tau = tau_tool_turns(run)
    react = react_steps(
        json.loads((public_data / "react_alfworld" / "alfworld_3prompts.json").read_text())["react_put_0"]
    )
    cases = [
        # get_user_details({"user_id":"mia_li_3668"}): the profile shares none of the 3 action words.
        (tau[0], 3, 0, "retrieval"),
        # calculate({"expression":"152 + 103"}) -> '255.0': {calculate, expression, 152, 103} vs {255, 0}.
        (tau[3], 4, 0, "action"),
        # think({...}) -> '': no observation words.
        (tau[5], None, 0, "other"),
        # The booking confirmation repeats 38 of the call's 40 words (not book_reservation,
        # payment_methods) and adds 10: reservation_id, hathat, price, 152, atl, 103, payment_history,
        # created_at, 15t15, 00.
        (tau[7], 40, 38, "echo"),
        # go to cabinet 1 -> On the cabinet 1, you see a cloth 1, a soapbar 1, a soapbottle 1.
        (react[2], 4, 2, "expansion"),
        # go to cabinet 2 -> The cabinet 2 is closed.  (OL 2/4, Nov 3/5, R 24/15)
        (react[3], 4, 2, "expansion"),
        # put spraybottle 2 in/on toilet 1 -> You put the spraybottle 2 in/on the toilet 1.
        (react[-1], 7, 7, "echo"),
    ]
    for turn, action_words, shared, category in cases:
        a, o = word_set(turn[0]), word_set(turn[1])
        if action_words is not None:
            assert len(a) == action_words, turn[0]
        assert len(a & o) == shared, turn
        assert score_turn(*turn, DEFAULT).category == category, turn
    assert react[3] == ("go to cabinet 2", "The cabinet 2 is closed.")
    m = turn_metrics(*react[3])
    assert (m.overlap, m.novelty, m.jaccard, m.length_ratio) == (0.5, 0.6, 2 / 7, 24 / 15)
    booking = turn_metrics(*tau[7])
    assert len(word_set(tau[7][1])) == 48
    assert (booking.overlap, booking.novelty, booking.jaccard) == (38 / 40, 10 / 48, 38 / 50)
    assert turn_metrics(*tau[3]) == TurnMetrics(0.0, 1.0, 0.0, 5 / len(tau[3][0]), 5)
    assert turn_metrics(*tau[5]).novelty is None
