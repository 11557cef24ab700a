"""How evaluation scores an answer against the real observation: the judge and the judge-free metrics (issue 12).

One rule for every model (issue 17, item 10), and for every caller that scores an answer as the evaluation does
(the evaluate stage, closed-loop rollouts: pipeline/fidelity/): the judge configured in `evaluate.judge` (the
offline similarity judge by default, an LLM judge with the domain's rubric or AgentWorldBench's tagged prompt
where one is configured) scores the observation an answer yields, on its 1-5 scale, beside the similarity,
semantic match, ROUGE-L, masked exact match, JSON validity, strict exact match and line agreement. An answer
that yields no observation (a thinking answer without a closed `<think>` block) is scored as the empty one; a
failed generation (and, with `evaluate.exclude_empty_generations`, an empty one) is not scored at all.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipeline.evaluation.agreement import exact, line_agreement
from pipeline.evaluation.benchmark import strip_marker
from pipeline.evaluation.metrics import RougeL, exact_match, json_validity, semantic_match
from pipeline.sft.judging import CRITERIA
from pipeline.sft.queries import Query
from pipeline.sft.sampling import digest

if TYPE_CHECKING:  # imported where used
    from pipeline.config.evaluate import EvaluateConfig
    from pipeline.evaluation.tagged_judge import TaggedJudge
    from pipeline.sft.judging import LLMJudge, SemanticJudge


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a model's answer yields: its parse status, the observation (None where none parsed), its thinking,
    and the endpoint's error where the generation failed after its retries."""

    status: str
    observation: str | None
    thinking: str | None
    error: str | None


GENERATION_FAILED = "generation_failed"  # the answer format's status of an answer that never came
EMPTY_GENERATION = "empty_generation"
# Rows without scores: the endpoint failed, or (with `exclude_empty_generations`) the model wrote nothing.
UNSCORED = (GENERATION_FAILED, EMPTY_GENERATION)


class Scorer:
    """The judge and the judge-free metrics, shared by every model of a run.

    `fingerprint` keys the evaluations (a changed prompt, rubric or sampling is another judge); `name`
    is what every table and report shows (issue 18): the judge's model and its prompt with the digest
    of the prompt and rubric files, since scores are comparable only under one named judge."""

    judge: "SemanticJudge | TaggedJudge | LLMJudge"

    def __init__(self, evaluate: "EvaluateConfig", store):
        from pipeline.rewards.semantic import SemanticScorer
        from pipeline.sft.generators import judge_label
        from pipeline.sft.judging import LLMJudge, SemanticJudge
        from pipeline.sft.sampling import judge_files_digest

        self.kind = evaluate.judge.kind
        label = judge_label(evaluate.judge)
        self.fingerprint, self.name = label, "semantic"
        self.client = None
        if self.kind == "semantic":
            self.judge = SemanticJudge()
        else:
            from pipeline.evaluation.tagged_judge import TaggedJudge, prompts_digest
            from pipeline.llm.client import open_client

            self.client = open_client(evaluate.judge.endpoint, store, "evaluate.judge")
            model = label.split("#")[0]
            if evaluate.judge_prompt == "agentworldbench":
                self.judge = TaggedJudge(self.client, evaluate.judge.history_turns)
                self.fingerprint = f"{model}#{digest(label, 'agentworldbench', prompts_digest())}"
                self.name = f"{model} prompt:agentworldbench@{prompts_digest()}"
            else:
                self.judge = LLMJudge(self.client, evaluate.judge.history_turns)
                self.name = f"{model} prompt:rubric@{judge_files_digest()}"
            self.similarity = SemanticScorer()
        self.rouge = RougeL()
        self.threshold = evaluate.semantic_match_threshold

    def rows(
        self, queries: list[Query], predictions: list[Prediction], markers: list[str | None] | None = None
    ) -> list[dict[str, Any]]:
        """One rule for every model (issue 17, item 10): the judge and the metrics score the observation an
        answer yields, and an answer that yields none (a thinking answer without a closed `<think>`
        block) yields the empty observation, scored as one, as a non-thinking answer of whitespace is.
        How often a model's answers parse is the table's `parse_rate`, not a floor inside its score.
        A benchmark's response marker (`markers`, per query) is stripped from the prediction and the
        reference before anything scores them, as the benchmark's judge does."""
        from dataclasses import replace

        from pipeline.sft.judging import PointwiseItem

        markers = markers or [None] * len(queries)
        queries = [replace(q, reference=strip_marker(q.reference, m)) if m else q for q, m in zip(queries, markers)]
        answered = {
            i: strip_marker(p.observation or "", markers[i])
            for i, p in enumerate(predictions)
            if p.status not in UNSCORED
        }
        verdicts = dict(
            zip(answered, self.judge.pointwise([PointwiseItem(queries[i], text) for i, text in answered.items()]))
        )
        if self.kind == "semantic":  # the similarity judge's score is 1 + 4 x the similarity: not computed twice
            similarities = {i: (verdicts[i].score - 1.0) / 4.0 for i in answered}
        else:
            similarities = dict(
                zip(
                    answered,
                    (
                        s.value
                        for s in self.similarity.similarities(
                            [(text, queries[i].reference, queries[i].action) for i, text in answered.items()]
                        )
                    ),
                )
            )
        rows = []
        for i, (query, prediction) in enumerate(zip(queries, predictions)):
            row: dict[str, Any] = {
                "prediction": prediction.observation,
                "parse_status": prediction.status,
                "error": prediction.error,
            }
            if i in answered:  # a failed or (when excluded) empty generation: no scores, out of every mean
                text, verdict = answered[i], verdicts[i]
                row.update({name: (verdict.criteria or {}).get(name) for name in CRITERIA})
                row.update(
                    judge_raw=verdict.score if verdict.valid else None,
                    judge_valid=verdict.valid,
                    judge_invalid_reason=verdict.invalid_reason,
                    similarity=similarities[i],
                    semantic_match=semantic_match(similarities[i], self.threshold),
                    rouge_l=self.rouge(text, query.reference),
                    exact_match=exact_match(text, query.reference),
                    json_valid=json_validity(text, query.reference),
                    exact=exact(text, query.reference),
                    line_agreement=line_agreement(text, query.reference),
                )
            rows.append(row)
        return rows
