"""Agreement of a predicted text observation with the real one, scored as an observation (issue 17, item 11).

MiniLM cosine alone is high whenever prediction and reference share the action's words, so a chatty
answer that quotes the command ("wc -c logs/*.log ... This is a Bash command that counts ...") beat a
terse one in the environment's own form that was wrong by one byte. An observation is what the
environment adds to the action; so the deterministic parts are scored on their own, each in [0, 1]:

- content: F1 of the word tokens (lower-cased; a path or a dotted name is one token) that the action
  does not hold, counted with multiplicity. A token the action holds earns nothing, so restating the
  command is no credit. Where the reference holds nothing beyond the action (`echo hello` -> `hello`),
  the echo is the content and every word token counts;
- binding: ignoring the action's tokens also ignored which role the observation gives them: `take
  keychain 1 from drawer 3` answered "You pick up the keychain 3 from the drawer 1." agreed 1.00, and so
  did an `mv a.txt b.txt` error naming the files the other way round. So where the reference holds
  action tokens, the sequence of them as they stand in the reference (`keychain 1 from drawer 3`) is
  compared with that sequence in the prediction, as the F1 of their adjacent pairs, the start and end
  included (a binding is which action token stands next to which; a swap of two arguments breaks four
  of six pairs, where difflib's ratio would still give 0.6). It scales the F1 above, content = F1 x
  (1 - BINDING_SHARE + BINDING_SHARE x pairs), rather than adding to it: the pairs are exactly what an
  echo of the action gets right for free, so they only count on top of the environment's own tokens,
  and an echo with none of those still earns 0. The share 0.5: every pair broken halves the content
  (the environment's own tokens were still right), the swap scores 0.67, the right answer 1. Not seen: environment tokens bound to the wrong action token (`ls x y` with the two
  listings exchanged), since the held tokens' own sequence is unchanged there;
- format: the shape of the text, the sequence of token classes (number, word, each punctuation mark,
  line break) compared with difflib's ratio, and the number of lines: `170 field-notes.txt` has the
  shape of `169 field-notes.txt`, three sentences of explanation do not.

The embedding similarity joins them in semantic.py. Empty is content too: an empty reference is
matched only by an empty (or whitespace-only) prediction.
"""

import difflib
import re
from collections import Counter

# A word token: a run of word characters joined by the characters of paths, file names and versions.
TOKEN = re.compile(r"\w+(?:[./\-]\w+)*|[^\w\s]")
SHAPE_TOKENS = 400  # difflib is quadratic in the worst case: the shape of a long output is its start
SUBSTRING_MIN = 3  # a shorter token found inside the action is a coincidence, not an echo
BINDING_SHARE = 0.5  # of the content term that the action tokens' binding scales (module docstring)


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def action_words(action: str) -> set[str]:
    """The action's word tokens and their parts (`logs/app.log` also gives `logs`, `app`, `log`)."""
    words = set()
    for token in tokens(action.lower()):
        words.add(token)
        words.update(part for part in re.split(r"[./\-_]", token) if part)
    return words


def _in_action(token: str, words: set[str], action: str) -> bool:
    return token in words or (len(token) >= SUBSTRING_MIN and token in action)


def _f1(expected: Counter, predicted: Counter) -> float:
    if not expected and not predicted:
        return 1.0
    overlap = sum((expected & predicted).values())
    if overlap == 0:
        return 0.0
    recall, precision = overlap / sum(expected.values()), overlap / sum(predicted.values())
    return 2 * recall * precision / (recall + precision)


def _pairs(held: list[str]) -> Counter:
    """The adjacent pairs of the action tokens' sequence, its start and end marked (so one token is two pairs)."""
    sequence = ["", *held, ""]
    return Counter(zip(sequence, sequence[1:]))


def binding_agreement(prediction_words: list[str], reference_words: list[str], held) -> float:
    """F1 of the adjacent pairs of the action-held tokens, in the order each text holds them."""
    return _f1(_pairs([t for t in reference_words if held(t)]), _pairs([t for t in prediction_words if held(t)]))


def content_agreement(prediction: str, reference: str, action: str) -> float:
    action = action.lower()
    words = action_words(action)

    def held(token: str) -> bool:
        return _in_action(token, words, action)

    reference_words = [t for t in tokens(reference.lower()) if t[0].isalnum() or t[0] == "_"]
    prediction_words = [t for t in tokens(prediction.lower()) if t[0].isalnum() or t[0] == "_"]
    expected = Counter(t for t in reference_words if not held(t))
    if expected:
        predicted = Counter(t for t in prediction_words if not held(t))
    else:  # the observation is an echo of the action: the echo is what must be right
        expected, predicted = Counter(reference_words), Counter(prediction_words)
    own = _f1(expected, predicted)
    if own == 0.0 or not any(held(t) for t in reference_words):
        return own
    return own * (1.0 - BINDING_SHARE + BINDING_SHARE * binding_agreement(prediction_words, reference_words, held))


def _shape(text: str) -> list[str]:
    shape = []
    for line in text.strip().splitlines():
        for token in tokens(line)[:SHAPE_TOKENS]:
            shape.append("0" if token.isdigit() else "a" if token[0].isalnum() or token[0] == "_" else token)
        shape.append("\n")
        if len(shape) >= SHAPE_TOKENS:
            break
    return shape[:SHAPE_TOKENS]


def format_agreement(prediction: str, reference: str) -> float:
    """0.75 x the token-class sequences' difflib ratio + 0.25 x the ratio of the line counts."""
    sequence = difflib.SequenceMatcher(None, _shape(prediction), _shape(reference), autojunk=False).ratio()
    lines_p, lines_r = len(prediction.strip().splitlines()), len(reference.strip().splitlines())
    lines = min(lines_p, lines_r) / max(lines_p, lines_r) if max(lines_p, lines_r) else 1.0
    return 0.75 * sequence + 0.25 * lines
