"""Agreement of a predicted JSON observation with the real one, leaf by leaf (issue 17, item 5).

ROUGE-L over the two texts rewarded the key skeleton: a tool response with every value wrong, or with
every value empty, shares all its keys, quotes and braces with the reference and scored 0.50. Here
both are parsed and flattened into leaves, (path, value) with the path of keys and list indices that
leads to the value (an empty object or list is a leaf itself), and:

- value agreement: F1 of the leaves present in both with the same path and an equal value (1 == 1.0,
  but True != 1 and "17" != 17: a type is content). The key is the context of its value: a right value
  under another key does not count;
- key agreement: F1 of the leaf paths alone, the response's shape;
- score = 0.8 x values + 0.2 x keys, so the right skeleton with wrong values scores 0.2, and the coarse
  steps of SPEC's "rounded to coarse steps" (semantic.py) round that to 0.

A leaf whose value the action already holds (the `book_id` the call asked for, echoed back) weighs a
quarter of one the environment had to supply: repeating the request is not knowing the environment.
A prediction that does not parse as JSON scores 0 against a JSON reference.
"""

import json
import math
from collections.abc import Iterator

VALUE_SHARE = 0.8
ECHOED_LEAF_WEIGHT = 0.25  # a leaf the action already holds
Leaf = tuple[tuple[str | int, ...], object]


def parse_json(text: str):
    """The parsed object or array, or None where the text is not one."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        return None


def leaves(value, path: tuple[str | int, ...] = ()) -> Iterator[Leaf]:
    if isinstance(value, dict) and value:
        for key, child in value.items():
            yield from leaves(child, (*path, str(key)))
    elif isinstance(value, list) and value:
        for index, child in enumerate(value):
            yield from leaves(child, (*path, index))
    else:
        yield path, value


def _canonical(value) -> tuple[str, object]:
    """A value as compared: numbers by magnitude, everything else by type and value."""
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, (int, float)):
        return ("number", float(value)) if math.isfinite(value) else ("literal", repr(value))
    if isinstance(value, str):
        return ("string", value.strip())
    return ("container", json.dumps(value, sort_keys=True))


def _echoed(value, action: str) -> bool:
    if isinstance(value, bool) or value is None or isinstance(value, (dict, list)):
        return False
    text = str(value).strip().lower()
    return len(text) >= 2 and text in action


def _weights(value, action: str) -> dict[tuple[str | int, ...], float]:
    return {path: ECHOED_LEAF_WEIGHT if _echoed(leaf, action) else 1.0 for path, leaf in leaves(value)}


def _f1(matched_reference: float, reference_total: float, matched_prediction: float, prediction_total: float) -> float:
    if reference_total == 0 and prediction_total == 0:
        return 1.0
    if reference_total == 0 or prediction_total == 0 or matched_reference == 0:
        return 0.0
    recall, precision = matched_reference / reference_total, matched_prediction / prediction_total
    return 2 * recall * precision / (recall + precision)


def _agreements(prediction: str, reference: str, action: str) -> tuple[float, float]:
    """(value agreement, key agreement) of the two JSON texts' leaves; (0, 0) where either does not parse."""
    expected, predicted = parse_json(reference), parse_json(prediction)
    if expected is None or predicted is None:
        return 0.0, 0.0
    action = action.lower()
    reference_leaves = {path: _canonical(value) for path, value in leaves(expected)}
    prediction_leaves = {path: _canonical(value) for path, value in leaves(predicted)}
    reference_weights = _weights(expected, action)
    prediction_weights = _weights(predicted, action)
    same = [path for path, value in reference_leaves.items() if prediction_leaves.get(path, ("absent",)) == value]
    values = _f1(
        sum(reference_weights[p] for p in same),
        sum(reference_weights.values()),
        sum(prediction_weights[p] for p in same),
        sum(prediction_weights.values()),
    )
    shared = reference_leaves.keys() & prediction_leaves.keys()
    keys = _f1(len(shared), len(reference_leaves), len(shared), len(prediction_leaves))
    return values, keys


def value_agreement(prediction: str, reference: str, action: str = "") -> float:
    """In [0, 1]: the leaf-value agreement alone, the response's content without its shape (issue 17, item 7)."""
    return _agreements(prediction, reference, action)[0]


def json_agreement(prediction: str, reference: str, action: str = "") -> float:
    """In [0, 1]: 0.8 x value agreement + 0.2 x key agreement of the two JSON texts' leaves."""
    values, keys = _agreements(prediction, reference, action)
    return VALUE_SHARE * values + (1.0 - VALUE_SHARE) * keys
