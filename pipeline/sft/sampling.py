"""Rejection sampling over the store: candidates, judgements and selections, persisted as produced.

`RejectionSampler.run(queries)` takes the queries a batch at a time (`sft.batch_queries`) and, for
each batch, in this order, each step committed before the next begins:
1. candidates: every generator writes its `samples` per query; each is parsed strictly and stored
   in `sft_candidates`, parsed or not;
2. pointwise judgements of the parsed candidates, into `judgements` (kind `pointwise`);
3. with a judge that compares pairwise (the LLM judge), pairwise judgements of each query's
   competitors, the candidates that pass `min_score` and the thinking check, round robin in both
   orders (kind `pairwise`); the similarity judge makes none (pipeline/sft/selection.py);
4. the selection of each query, into `sft_samples`: kept or discarded, why, what decided it, and
   the system-prompt template drawn for a kept one.
Every row has an id hashed from what determines it (query, generator or judge, sample index,
candidates compared), and every step first reads which of its rows exist: a rerun after a kill
does only what is missing. An LLM answer that arrived before the kill but whose row was not yet
committed is in the client's cache (pipeline/llm/cache.py), so it is not asked again.
A request that failed (a 401, a dead endpoint) is recorded but is not done: its candidate or
judgement row is asked again by the next run, and a query with such a row is left undecided (no
`sft_samples` row), so fixing the endpoint and rerunning finishes it.

Generators and judges are named by a label plus a digest of everything that shapes their output
(model, sampling parameters, prompt and rubric files), so a changed prompt produces new rows
instead of reusing old ones. A selection is keyed by (the selection rules' version, generators,
judge, min_score, min_agreement).
"""

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pipeline.prompts.sft import TEMPLATES, draw_template
from pipeline.rewards.rubrics import PROMPTS_DIR, files_digest, prompt_text, rubric_files
from pipeline.sft.candidates import parse_candidate
from pipeline.sft.judging import CRITERIA, PairwiseItem, PointwiseItem
from pipeline.sft.queries import Query, chat_messages
from pipeline.sft.selection import SELECTION_RULES, Contender, Rules, competitors, decide, pairings

GENERATOR_PROMPT = "sft_generator"
FAILED_CANDIDATE = "parse_status = 'generation_failed'"
# A request that failed, and any judgement that is no judgement: the judge's answers are checked as they arrive
# (pipeline/sft/judging.py `pointwise_rejection`), so an invalid row is one stored before they were, asked again.
FAILED_JUDGEMENT = "invalid_reason IS NOT NULL"
JUDGE_PROMPTS = ("sft_judge_pointwise", "sft_judge_pairwise")


def digest(*parts: Any) -> str:
    payload = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class GeneratedText:
    text: str | None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(slots=True)
class Generator:
    """One configured generator: its label and a function from (query, sample index) pairs to texts."""

    label: str
    samples: int
    order_base: int  # candidate order of this generator's sample 0 among a query's candidates
    generate: Callable[[list[tuple[Query, int]]], list[GeneratedText]]


def generator_messages(query: Query) -> tuple[dict[str, str], ...]:
    """The generator's prompt (data/prompts/sft_generator.md) around SFT template 0 (which asks for the
    thinking format), then the kept history as user/assistant turns, then the action."""
    environment = TEMPLATES[0].render(query.domain, query.system)
    return chat_messages(query, prompt_text(GENERATOR_PROMPT).replace("{environment}", environment))


def generator_prompt_digest() -> str:
    return files_digest([PROMPTS_DIR / f"{GENERATOR_PROMPT}.md"])


def judge_files_digest() -> str:
    return files_digest([PROMPTS_DIR / f"{name}.md" for name in JUDGE_PROMPTS] + rubric_files())


def candidate_id(query_id: str, generator: str, sample_index: int) -> str:
    return digest("candidate", query_id, generator, sample_index)


def judgement_id(kind: str, judge: str, candidate_a: str, candidate_b: str | None = None) -> str:
    return digest(kind, judge, candidate_a, candidate_b)


@dataclass(slots=True)
class SamplingTally:
    candidates_generated: int = 0
    pointwise_judged: int = 0
    pairwise_judged: int = 0
    selections_made: int = 0


class RejectionSampler:
    def __init__(
        self,
        store,
        generators: Sequence[Generator],
        judge,
        judge_label: str,
        min_score: float,
        min_agreement: float | None,
        seed: int,
        batch_queries: int,
        after_batch: Callable[[int], None] = lambda done: None,
    ):
        self.store = store
        self.generators = list(generators)
        self.judge = judge
        self.judge_label = judge_label
        self.rules = Rules(min_score, min_agreement, judge.compares_pairwise)
        self.seed = seed
        self.batch_queries = batch_queries
        self.after_batch = after_batch
        self.selection = digest(
            "selection", SELECTION_RULES, [g.label for g in self.generators], judge_label, min_score, min_agreement
        )
        self.tally = SamplingTally()

    def run(self, queries: Sequence[Query], advance: Callable[[int], None] = lambda n: None) -> SamplingTally:
        for start in range(0, len(queries), self.batch_queries):
            batch = list(queries[start : start + self.batch_queries])
            self._candidates(batch)
            self._pointwise(batch)
            self._pairwise(batch)
            self._select(batch)
            advance(len(batch))
            self.after_batch(start + len(batch))
        return self.tally

    # -- 1. candidates ----------------------------------------------------------------------------
    def _existing(self, table: str, column: str, ids: list[str], failed: str) -> set[str]:
        """The ids among `ids` already done: rows whose request did not fail."""
        if not ids:
            return set()
        rows = self.store.execute(
            f"SELECT {column} FROM {table} WHERE {column} IN (SELECT unnest(?::VARCHAR[])) AND NOT coalesce({failed}, false)",
            [ids],
        )
        return {row[0] for row in rows.fetchall()}

    def _candidates(self, batch: list[Query]) -> None:
        for generator in self.generators:
            wanted = [(query, k) for query in batch for k in range(generator.samples)]
            ids = [candidate_id(query.query_id, generator.label, k) for query, k in wanted]
            have = self._existing("sft_candidates", "candidate_id", ids, FAILED_CANDIDATE)
            todo = [(item, cid) for item, cid in zip(wanted, ids) if cid not in have]
            if not todo:
                continue
            texts = generator.generate([item for item, _ in todo])
            rows = []
            now = datetime.now()
            for ((query, k), cid), generated in zip(todo, texts):
                parsed = parse_candidate(generated.text)
                rows.append(
                    [
                        cid,
                        query.query_id,
                        query.trajectory_id,
                        query.turn_index,
                        query.domain,
                        generator.label,
                        k,
                        generated.text,
                        parsed.thinking,
                        parsed.prediction,
                        parsed.status,
                        generated.error,
                        generated.prompt_tokens,
                        generated.completion_tokens,
                        now,
                    ]
                )
            with self.store.transaction() as tx:
                tx.executemany(
                    "INSERT OR REPLACE INTO sft_candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
                )
            self.tally.candidates_generated += len(rows)

    def _batch_candidates(self, batch: list[Query]) -> dict[str, list[dict[str, Any]]]:
        """The batch's candidates of the configured generators, per query, in candidate order."""
        orders = {}
        for generator in self.generators:
            for query in batch:
                for k in range(generator.samples):
                    orders[candidate_id(query.query_id, generator.label, k)] = generator.order_base + k
        rows = self.store.rows(
            "SELECT candidate_id, query_id, parse_status, prediction FROM sft_candidates "
            "WHERE candidate_id IN (SELECT unnest(?::VARCHAR[]))",
            [list(orders)],
        )
        per_query: dict[str, list[dict[str, Any]]] = {query.query_id: [] for query in batch}
        for row in rows:
            row["order"] = orders[row["candidate_id"]]
            per_query[row["query_id"]].append(row)
        for candidates in per_query.values():
            candidates.sort(key=lambda row: row["order"])
        return per_query

    # -- 2. pointwise -----------------------------------------------------------------------------
    def _pointwise(self, batch: list[Query]) -> None:
        per_query = self._batch_candidates(batch)
        by_id = {query.query_id: query for query in batch}
        parsed = [(by_id[qid], row) for qid, rows in per_query.items() for row in rows if row["parse_status"] == "ok"]
        ids = [judgement_id("pointwise", self.judge_label, row["candidate_id"]) for _, row in parsed]
        have = self._existing("judgements", "judgement_id", ids, FAILED_JUDGEMENT)
        todo = [(item, jid) for item, jid in zip(parsed, ids) if jid not in have]
        if not todo:
            return
        verdicts = self.judge.pointwise([PointwiseItem(query, row["prediction"]) for (query, row), _ in todo])
        now = datetime.now()
        rows = []
        for ((query, row), jid), verdict in zip(todo, verdicts):
            criteria = [verdict.criteria[name] if verdict.criteria else None for name in CRITERIA]
            rows.append(
                [
                    jid,
                    "pointwise",
                    query.query_id,
                    self.judge_label,
                    row["candidate_id"],
                    None,
                    *criteria,
                    verdict.score,
                    None,
                    verdict.valid,
                    verdict.invalid_reason,
                    verdict.raw,
                    now,
                ]
            )
        with self.store.transaction() as tx:
            tx.executemany(
                "INSERT OR REPLACE INTO judgements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
        self.tally.pointwise_judged += len(rows)

    def _contenders(self, batch: list[Query]) -> dict[str, tuple[list[Contender], bool]]:
        """Per query: its parsed candidates with a valid pointwise score and the judge's agreement of their
        prediction with the reference, and whether any parsed."""
        per_query = self._batch_candidates(batch)
        by_id = {query.query_id: query for query in batch}
        ids = [
            judgement_id("pointwise", self.judge_label, r["candidate_id"]) for rows in per_query.values() for r in rows
        ]
        verdicts = {
            row["candidate_a"]: row
            for row in self.store.rows(
                f"SELECT candidate_a, score, {', '.join(CRITERIA)} FROM judgements "
                "WHERE valid AND judgement_id IN (SELECT unnest(?::VARCHAR[]))",
                [ids],
            )
        }
        result = {}
        for qid, rows in per_query.items():
            contenders = []
            for row in rows:
                verdict = verdicts.get(row["candidate_id"])
                if verdict is None:
                    continue
                item = PointwiseItem(by_id[qid], row["prediction"])
                agreement = self.judge.agreement(item, {name: verdict[name] for name in CRITERIA})
                contenders.append(Contender(row["candidate_id"], row["order"], verdict["score"], agreement))
            result[qid] = (contenders, any(r["parse_status"] == "ok" for r in rows))
        return result

    # -- 3. pairwise ------------------------------------------------------------------------------
    def _pairwise(self, batch: list[Query]) -> None:
        if not self.rules.pairwise:
            return
        by_id = {query.query_id: query for query in batch}
        wanted = [
            (by_id[qid], a, b)
            for qid, (contenders, _) in self._contenders(batch).items()
            for a, b in pairings(competitors(contenders, self.rules))
        ]
        ids = [judgement_id("pairwise", self.judge_label, a.candidate_id, b.candidate_id) for _, a, b in wanted]
        have = self._existing("judgements", "judgement_id", ids, FAILED_JUDGEMENT)
        todo = [(item, jid) for item, jid in zip(wanted, ids) if jid not in have]
        if not todo:
            return
        predictions = {
            row["candidate_id"]: row["prediction"]
            for row in self.store.rows(
                "SELECT candidate_id, prediction FROM sft_candidates WHERE candidate_id IN (SELECT unnest(?::VARCHAR[]))",
                [sorted({c.candidate_id for (_, a, b), _ in todo for c in (a, b)})],
            )
        }
        items = [
            PairwiseItem(query, predictions[a.candidate_id], predictions[b.candidate_id]) for (query, a, b), _ in todo
        ]
        preferences = self.judge.pairwise(items)
        now = datetime.now()
        rows = [
            [
                jid,
                "pairwise",
                query.query_id,
                self.judge_label,
                a.candidate_id,
                b.candidate_id,
                *([None] * len(CRITERIA)),
                None,
                preference.winner,
                preference.valid,
                preference.invalid_reason,
                preference.raw,
                now,
            ]
            for ((query, a, b), jid), preference in zip(todo, preferences)
        ]
        with self.store.transaction() as tx:
            tx.executemany(
                "INSERT OR REPLACE INTO judgements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
        self.tally.pairwise_judged += len(rows)

    # -- 4. selection -----------------------------------------------------------------------------
    def _select(self, batch: list[Query]) -> None:
        by_id = {query.query_id: query for query in batch}
        done = {
            row[0]
            for row in self.store.execute(
                "SELECT query_id FROM sft_samples WHERE selection = ? AND query_id IN (SELECT unnest(?::VARCHAR[]))",
                [self.selection, list(by_id)],
            ).fetchall()
        }
        unsettled = self._unsettled(list(by_id))
        undecided = {
            qid: entry for qid, entry in self._contenders(batch).items() if qid not in done and qid not in unsettled
        }
        preferences = self._preferences([contenders for contenders, _ in undecided.values()])
        now = datetime.now()
        rows = []
        for qid, (contenders, any_parsed) in undecided.items():
            selection = decide(contenders, any_parsed, self.rules, preferences)
            query = by_id[qid]
            template = (
                draw_template(self.seed, query.trajectory_id, query.turn_index).template_id if selection.kept else None
            )
            rows.append(
                [
                    qid,
                    self.selection,
                    query.trajectory_id,
                    query.turn_index,
                    query.domain,
                    selection.kept,
                    selection.reason,
                    selection.winner,
                    selection.runner_up,
                    selection.decided_by,
                    selection.score,
                    template,
                    now,
                ]
            )
        if rows:
            with self.store.transaction() as tx:
                tx.executemany("INSERT INTO sft_samples VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            self.tally.selections_made += len(rows)

    def _unsettled(self, query_ids: list[str]) -> set[str]:
        """Queries with a candidate or judgement whose request failed: deciding them now would discard
        them for good, when the next run against a working endpoint may keep them."""
        candidates = self._candidate_ids(query_ids)
        rows = self.store.execute(
            f"""SELECT query_id FROM sft_candidates WHERE {FAILED_CANDIDATE} AND query_id IN (SELECT unnest(?::VARCHAR[]))
                AND candidate_id IN (SELECT unnest(?::VARCHAR[]))
                UNION SELECT query_id FROM judgements WHERE judge = ? AND {FAILED_JUDGEMENT}
                AND candidate_a IN (SELECT unnest(?::VARCHAR[]))""",
            [query_ids, candidates, self.judge_label, candidates],
        ).fetchall()
        return {row[0] for row in rows}

    def _candidate_ids(self, query_ids: list[str]) -> list[str]:
        return [candidate_id(qid, g.label, k) for qid in query_ids for g in self.generators for k in range(g.samples)]

    def _preferences(self, per_query: list[list[Contender]]) -> dict[tuple[str, str], str | None]:
        """The stored pairwise answers over each query's pairings, as (A, B) -> winner (None: invalid)."""
        if not self.rules.pairwise:
            return {}
        pairs = {
            judgement_id("pairwise", self.judge_label, a.candidate_id, b.candidate_id): (a.candidate_id, b.candidate_id)
            for contenders in per_query
            for a, b in pairings(competitors(contenders, self.rules))
        }
        if not pairs:
            return {}
        rows = self.store.rows(
            "SELECT judgement_id, winner FROM judgements WHERE judgement_id IN (SELECT unnest(?::VARCHAR[]))",
            [list(pairs)],
        )
        return {pairs[row["judgement_id"]]: row["winner"] for row in rows}
