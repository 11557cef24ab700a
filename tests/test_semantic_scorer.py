"""The offline judge scores an observation as an observation: case tables of (action, reference, predictions)
ranked as a person would, and JSON scored by its values (issue 17, items 5 and 11). Real MiniLM embeddings."""

import pytest

from pipeline.rewards.json_agreement import json_agreement
from pipeline.rewards.semantic import SemanticScorer, deterministic_agreement


@pytest.fixture(scope="module")
def scorer():
    return SemanticScorer()


CHATTY_WC = (
    "wc -c field-notes.txt\n\nThis is a Bash command that counts the bytes in the file field-notes.txt "
    "and prints the count followed by the file name."
)

TAKE, TAKEN = "take keychain 1 from drawer 3", "You pick up the keychain 1 from the drawer 3."
TAKEN_SWAPPED = "You pick up the keychain 3 from the drawer 1."
MOVE, MOVE_FAILED = "mv a.txt b.txt", "mv: cannot move 'a.txt' to 'b.txt': No such file or directory"
MOVE_FAILED_SWAPPED = "mv: cannot move 'b.txt' to 'a.txt': No such file or directory"

# (domain, action, reference, [terse correct, terse wrong by one, chatty restatement, empty or whitespace])
RANKED = [
    (
        "terminal",
        "wc -c field-notes.txt",
        "169 field-notes.txt",
        ["169 field-notes.txt", "170 field-notes.txt", CHATTY_WC, "   "],
    ),
    (
        "terminal",
        "ls docs",
        "field-notes.txt\nreadme.md\nplan.md",
        [
            "field-notes.txt\nreadme.md\nplan.md\n",
            "field-notes.txt\nreadme.md\nplans.md",
            "The command `ls docs` lists the files in the docs directory, for example field-notes.txt and readme.md.",
            "",
        ],
    ),
    (
        "terminal",
        "grep -c ERROR logs/app.log",
        "3",
        ["3", "4", "grep -c ERROR logs/app.log counts the lines of logs/app.log that contain ERROR.", "\n"],
    ),
    (
        "terminal",
        "cat logs/app.log",
        "2026-11-30 12:00:01 INFO started worker 3\n2026-11-30 12:00:02 ERROR disk full on /var",
        [
            "2026-11-30 12:00:01 INFO started worker 3\n2026-11-30 12:00:02 ERROR disk full on /var",
            "2026-11-30 12:00:01 INFO started worker 4\n2026-11-30 12:00:02 ERROR disk full on /var",
            "cat logs/app.log prints the contents of the log file logs/app.log, which holds the application's log lines.",
            " \n ",
        ],
    ),
    (
        "mcp",
        '{"name": "get_book", "arguments": {"book_id": "B17"}}',
        '{"book_id": "B17", "title": "Dune", "copies": 3, "available": true}',
        [
            '{"book_id": "B17", "title": "Dune", "copies": 3, "available": true}',
            '{"book_id": "B17", "title": "Dune", "copies": 2, "available": true}',
            'The tool get_book returns the book with book_id B17: {"book_id": "B17"}',
            "",
        ],
    ),
    (
        "text-game",
        "go north",
        "You are in the kitchen. A brass lamp lies on the table. Exits: south, east.",
        [
            "You are in the kitchen. A brass lamp lies on the table. Exits: south, east.",
            "You are in the kitchen. A brass lamp lies on the table. Exits: south, west.",
            "You go north. Going north takes you to the north of where you were, moving in the north direction.",
            " ",
        ],
    ),
    # wrong by one here is the action's own arguments bound the other way round
    (
        "text-game",
        TAKE,
        TAKEN,
        [
            TAKEN,
            TAKEN_SWAPPED,
            "You take keychain 1 from drawer 3. The take command moves keychain 1 from drawer 3 into your inventory.",
            "",
        ],
    ),
    (
        "terminal",
        MOVE,
        MOVE_FAILED,
        [
            MOVE_FAILED,
            MOVE_FAILED_SWAPPED,
            "mv a.txt b.txt renames the file a.txt to b.txt, replacing b.txt if it exists.",
            " ",
        ],
    ),
]


@pytest.mark.parametrize(
    ("domain", "action", "reference", "predictions"), RANKED, ids=[f"{c[0]}:{c[1]}" for c in RANKED]
)
def test_terse_correct_beats_wrong_by_one_beats_chatty_restatement_beats_empty(
    scorer, domain, action, reference, predictions
):
    scores = [s.value for s in scorer.similarities([(p, reference, action) for p in predictions])]
    assert all(0.0 <= s <= 1.0 for s in scores)
    correct, wrong_by_one, chatty, empty = scores
    assert correct == pytest.approx(1.0), scores
    assert correct > wrong_by_one > chatty > empty == 0.0, scores


def test_restating_the_action_earns_nothing_the_action_held(scorer):
    action, reference = "wc -c field-notes.txt", "169 field-notes.txt"
    [echo, chatty] = scorer.similarities([(action, reference, action), (CHATTY_WC, reference, action)])
    [blind] = scorer.similarities([(CHATTY_WC, reference, "")])  # the same text, the action not given
    assert echo.value < 0.5 and chatty.value < blind.value


@pytest.mark.parametrize(
    ("prediction", "reference", "expected", "method", "why"),
    [
        ("", "", 1.0, "empty_reference", "`mkdir x` prints nothing: an empty prediction is right"),
        ("  \n", "", 1.0, "empty_reference", "whitespace is no output either"),
        ("mkdir creates the directory x.", "", 0.0, "empty_reference", "anything else is wrong"),
        ("hello\n", "hello", 1.0, "identical", "a trailing line end is not content"),
        ("", "hello", 0.0, "observation", "an empty prediction of a real output"),
        ('{"a": 1}', '{"a": 1.0}', 1.0, "json_leaves", "numbers by magnitude"),
    ],
)
def test_empty_and_identical(scorer, prediction, reference, expected, method, why):
    [similarity] = scorer.similarities([(prediction, reference, "mkdir x")])
    assert (similarity.value, similarity.method) == (pytest.approx(expected), method), why


BOOK = '{"book_id": "B17", "title": "Dune", "author": "Herbert", "copies": 3, "available": true}'
CALL = '{"name": "get_book", "arguments": {"book_id": "B17"}}'


@pytest.mark.parametrize(
    ("prediction", "step", "why"),
    [
        (
            '{"book_id":"B17","title":"Dune","author":"Herbert","copies":3,"available":true}',
            1.0,
            "spacing is not content",
        ),
        (
            '{"available": true, "copies": 3, "author": "Herbert", "title": "Dune", "book_id": "B17"}',
            1.0,
            "key order is not content",
        ),
        (
            '{"book_id": "B17", "title": "Dune", "author": "Herbert", "copies": 4, "available": true}',
            0.75,
            "one value wrong costs",
        ),
        (
            '{"book_id": "B17", "title": "Dune", "author": "Asimov", "copies": 4, "available": true}',
            0.5,
            "two wrong cost more",
        ),
        (
            '{"book_id": "B18", "title": "Emma", "author": "Austen", "copies": 9, "available": false}',
            0.0,
            "the right keys, every value wrong",
        ),
        (
            '{"book_id": "", "title": "", "author": "", "copies": 0, "available": null}',
            0.0,
            "the keys with no values at all",
        ),
        (
            '{"book_id": "B17", "title": "", "author": "", "copies": 0, "available": null}',
            0.0,
            "only the echoed id right",
        ),
        (
            '{"book_id": "B17", "title": "Dune", "author": "Herbert", "copies": "3", "available": true}',
            0.75,
            "a string is not a number",
        ),
        (
            '{"title": "Dune", "author": "Herbert", "copies": 3, "available": true, "extra": 1, "more": 2}',
            0.75,
            "invented keys cost precision",
        ),
        (
            '{"book": {"title": "Dune", "author": "Herbert", "copies": 3}}',
            0.0,
            "a right value under another key does not count",
        ),
    ],
)
def test_json_scores_values_with_keys_as_context(scorer, prediction, step, why):
    [similarity] = scorer.similarities([(prediction, BOOK, CALL)])
    assert (similarity.value, similarity.method) == (step, "json_leaves"), why


def test_prose_where_the_environment_answers_json_scores_below_one_step(scorer):
    [prose, restated, empty] = scorer.similarities(
        [
            ("book B17: Dune by Herbert, 3 copies", BOOK, CALL),
            ("get_book was called with book_id B17", BOOK, CALL),
            ("", BOOK, CALL),
        ]
    )
    assert empty.value == 0.0 < restated.value < prose.value < 0.25 and prose.method == "json_leaves"


@pytest.mark.parametrize(
    ("prediction", "reference", "expected"),
    [
        ('{"items": []}', '{"items": []}', 1.0),
        ('{"items": [3]}', '{"items": []}', 0.0),
        ('{"items": [3, 4]}', '{"items": [3, 5]}', 0.8 * 0.5 + 0.2),
        ("[1, 2]", "[2, 1]", 0.2),  # a list's order is content
        ('{"ok": true}', '{"ok": 1}', 0.2),  # true is not 1
    ],
)
def test_json_leaf_agreement(prediction, reference, expected):
    assert json_agreement(prediction, reference) == pytest.approx(expected)


def test_an_echoed_leaf_weighs_less_than_one_the_environment_supplied():
    echoed_wrong = '{"book_id": "B99", "title": "Dune", "author": "Herbert", "copies": 3, "available": true}'
    supplied_wrong = '{"book_id": "B17", "title": "Emma", "author": "Herbert", "copies": 3, "available": true}'
    assert json_agreement(echoed_wrong, BOOK, CALL) > json_agreement(supplied_wrong, BOOK, CALL)


LISTING = "field-notes.txt\nreadme.md\nplan.md"
EVERY_VALUE_WRONG = '{"book_id": "B18", "title": "Emma", "author": "Austen", "copies": 1, "available": false}'


@pytest.mark.parametrize(
    ("action", "prediction", "reference", "expected", "why"),
    [
        ("mkdir x", "", "", 1.0, "an empty reference: an empty prediction agrees"),
        ("mkdir x", "mkdir creates the directory x.", "", 0.0, "an empty reference: anything else disagrees"),
        ("echo hello", "hello\n", "hello", 1.0, "identical, line ends aside"),
        (
            "wc -c field-notes.txt",
            "170 field-notes.txt",
            "169 field-notes.txt",
            0.0,
            "the one fact the environment adds is wrong (the full score gives it 0.48)",
        ),
        ("wc -c field-notes.txt", CHATTY_WC, "169 field-notes.txt", 0.0, "restating the command states no fact"),
        ("ls docs", "field-notes.txt\nreadme.md\nplans.md", LISTING, pytest.approx(2 / 3), "two names of three right"),
        ("cat x", "", "hello", 0.0, "an empty prediction of a real output"),
        (
            CALL,
            BOOK.replace('"copies": 3', '"copies": 2'),
            BOOK,
            pytest.approx(3.25 / 4.25),
            "JSON: one supplied value of four wrong (the echoed book_id weighs a quarter)",
        ),
        (CALL, EVERY_VALUE_WRONG, BOOK, 0.0, "JSON: the right keys with every value wrong agree on nothing"),
        (
            CALL,
            "The book B17 is Dune by Herbert, 3 copies, available.",
            BOOK,
            0.0,
            "prose where the environment answers JSON",
        ),
        (TAKE, TAKEN.rstrip("."), TAKEN, 1.0, "the action's tokens in the reference's roles"),
        (
            TAKE,
            TAKEN_SWAPPED,
            TAKEN,
            pytest.approx(2 / 3),
            "the object's and the receptacle's numbers swapped: 2 of the 6 pairs of action tokens agree",
        ),
        (
            TAKE,
            "You pick up the apple 1 from the drawer 3.",
            TAKEN,
            pytest.approx(10 / 11 * (0.5 + 0.5 * 8 / 11)),
            "another object: an extra token of the environment's, one pair of action tokens fewer",
        ),
        (TAKE, TAKE, TAKEN, 0.0, "an echo of the action: its tokens in the right order, nothing the environment adds"),
        (MOVE, MOVE_FAILED_SWAPPED, MOVE_FAILED, pytest.approx(0.625), "the files named in each other's roles"),
        (
            "cp notes.txt backup/notes.txt",
            "cp: cannot stat 'backup/notes.txt': No such file or directory",
            "cp: cannot stat 'notes.txt': No such file or directory",
            pytest.approx(2 / 3),
            "the target named as the source",
        ),
        ("echo a b", "b a", "a b", 0.5, "an echo is all content, and its order is part of it"),
    ],
)
def test_deterministic_agreement(action, prediction, reference, expected, why):
    assert deterministic_agreement(prediction, reference, action) == expected, why
