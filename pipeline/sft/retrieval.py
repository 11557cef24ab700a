"""The `retrieval` generator: a nearest-neighbour world model over the cpt pool (issue 10).

It predicts the observation of the cpt-pool turn most similar to the query, and says so in its
thinking block. It never looks at an sft, rl or eval trajectory: the index is built from the cpt
pool of the snapshot alone, so it cannot copy the reference it is judged against. A real, weak
baseline: it knows what this environment tends to answer to such an action, not what this state
implies.

Similarity: TF-IDF cosine over the key text of a turn, which is its action followed by the last
`history_turns` turns before it (action and observation, each cut to HISTORY_CHARS). Words are the
informativeness tokenizer's (runs of letters, digits, `_`), so `cat src/app.py` and an observation
citing `app.py` share words. TF-IDF rather than sentence embeddings: shell commands and JSON tool
calls are matched by their exact names and arguments, which sparse weights keep and a sentence
embedding blurs, and it indexes the demo's cpt pool in well under a second on 2 cores. A query only
meets turns of its own domain (all domains when its domain has none). Sample k is the (k+1)-th
nearest neighbour; ties go to the earlier turn in (trajectory id, turn index) order.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.errors import UserFixableError
from pipeline.sft.candidates import render_thinking_output
from pipeline.sft.queries import Query
from pipeline.store.schema import ScoredTurn
from pipeline.store.snapshot import read_pool

HISTORY_CHARS = 500
ACTION_EXCERPT_CHARS = 200
TOKEN_PATTERN = r"(?u)[^\W]+"


@dataclass(frozen=True, slots=True)
class IndexedTurn:
    trajectory_id: str
    turn_index: int
    domain: str
    action: str
    observation: str


def key_text(action: str, earlier: list[ScoredTurn] | tuple[ScoredTurn, ...], history_turns: int) -> str:
    parts = [action]
    for turn in list(earlier)[-history_turns:] if history_turns else []:
        parts += [turn.action[:HISTORY_CHARS], turn.observation[:HISTORY_CHARS]]
    return "\n".join(parts)


class RetrievalIndex:
    def __init__(self, snapshot_dir: Path, history_turns: int):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.history_turns = history_turns
        self.turns: list[IndexedTurn] = []
        keys: list[str] = []
        for trajectory in read_pool(snapshot_dir, "cpt"):
            for position, turn in enumerate(trajectory.turns):
                self.turns.append(
                    IndexedTurn(
                        trajectory.trajectory_id, turn.turn_index, trajectory.domain, turn.action, turn.observation
                    )
                )
                keys.append(key_text(turn.action, trajectory.turns[:position], history_turns))
        if not self.turns:
            raise UserFixableError("the retrieval generator needs turns in the cpt pool, and it holds none")
        self.vectorizer = TfidfVectorizer(
            token_pattern=TOKEN_PATTERN, lowercase=True, sublinear_tf=True, dtype=np.float32
        )
        self.matrix = self.vectorizer.fit_transform(keys)
        self.domains = np.array([turn.domain for turn in self.turns])

    def neighbours(self, queries: list[Query], count: int) -> list[list[tuple[IndexedTurn, float]]]:
        """The `count` nearest cpt turns of each query, nearest first, with their cosine similarity."""
        keys = [key_text(query.action, query.history, self.history_turns) for query in queries]
        similarities = (self.vectorizer.transform(keys) @ self.matrix.T).toarray()
        results = []
        for query, row in zip(queries, similarities):
            same_domain = self.domains == query.domain
            if same_domain.any():
                row = np.where(same_domain, row, -1.0)
            # Stable sort on -similarity: equal similarities keep index order.
            order = np.argsort(-row, kind="stable")[:count]
            results.append([(self.turns[i], float(row[i])) for i in order])
        return results

    def candidate_text(self, query: Query, neighbour: IndexedTurn, similarity: float, rank: int) -> str:
        action = (
            neighbour.action
            if len(neighbour.action) <= ACTION_EXCERPT_CHARS
            else neighbour.action[:ACTION_EXCERPT_CHARS] + "..."
        )
        thinking = (
            f"Retrieval baseline, not a language model. The cpt-pool turn most like this action and the last "
            f"{self.history_turns} turn(s), neighbour {rank + 1} by TF-IDF cosine ({similarity:.3f}), is turn "
            f"{neighbour.turn_index} of trajectory {neighbour.trajectory_id[:12]} ({neighbour.domain}), whose action "
            f"was:\n{action}\nI predict the observation the environment returned to it."
        )
        return render_thinking_output(thinking, neighbour.observation)
