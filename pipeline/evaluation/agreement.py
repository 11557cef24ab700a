"""Strict, judge-free agreement of a prediction with the real observation (issue 18, item 6).

- `exact`: the whole observation equal to the reference once surrounding whitespace is stripped
  (eval.py strips both before its judge sees them), nothing masked: a timestamp that differs is a
  difference. The masked `exact_match` (pipeline/evaluation/metrics.py) is the lenient companion.
- `line_agreement`: the share of lines the two have in common, in order: 2 x M / (lines of the
  prediction + lines of the reference), M the lines in difflib's matching blocks (each line compared
  with its trailing whitespace stripped). 1 for two empty observations, 0 when nothing lines up. A
  terminal listing with one wrong line out of ten scores 0.9 where `exact` scores 0.
"""

import difflib


def exact(prediction: str, reference: str) -> bool:
    return prediction.strip() == reference.strip()


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()] if text.strip() else []


def line_agreement(prediction: str, reference: str) -> float:
    predicted, real = _lines(prediction), _lines(reference)
    if not predicted and not real:
        return 1.0
    matcher = difflib.SequenceMatcher(None, predicted, real, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    return 2.0 * matched / (len(predicted) + len(real))
