"""The RL rewards as TRL reward functions: the main reward (rubric or semantic) and the rule reward.

Every reward is on one scale, [0, 25], so the configured weights (SPEC: 0.9 / 0.1) mix like with like:
- rubric: the LLM judge's five criteria, 1-5 each (the SFT judge's prompt, JSON schema and validation,
  pipeline/sft/judging.py), reward = mean x 5, in [5, 25];
- semantic (after RWML): 25 x the offline judge's score in [0, 1], which scores what the observation
  adds to the action, its format and its meaning (per-leaf values for JSON, pipeline/rewards/semantic.py);
  on a prompt with a control instruction, whose reference shows no fault, the instruction's rule instead
  (`control_reward`: 25 obeyed in the environment's form, 15 in another, 0 not obeyed);
- rule: 25 when the turn's verifier passes the prediction, 0 when it fails or breaks, in the sandbox
  (pipeline/rewards/rule.py); None (TRL: "does not apply") for a turn without a verifier, and for a
  prompt with a control instruction (the verifier checks the fault-free observation).

Strict extraction: each completion is decoded from its token ids (the text the policy wrote, before
any chat-template response parsing) and parsed in the run's answer format (pipeline/prompts/answer_format.py).
In the thinking format, a completion without exactly one non-empty `<think>...</think>` block gets 0
from every reward that applies, is counted, and never reaches the judge; a parsed one reaches it
without its thinking, so self-praise in the reasoning cannot raise its score (SPEC.md, Stage 3). In the
direct format the completion is the observation, unless it writes a thinking tag (then 0, counted
alike). An unparseable, incomplete
or out-of-range judge answer, or a failed judge request, gives 0 and is counted.

Per step, through TRL's `log_metric`, next to TRL's own per-function means and the combined reward:
the judge's failure rate, the share of completions missing their tags, the rule reward's coverage and
pass rate, the share of prompts with a control instruction and of their completions that obey it.

The reward functions are `async`: TRL awaits them together, so the judge's requests for a batch run
concurrently through the shared LLM client (bounded by its `concurrency`) while the verifiers run in
their sandboxes in a thread.
"""

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from pipeline.config.rl import RewardConfig
from pipeline.rewards.semantic import is_json
from pipeline.rl.controls import obeys
from pipeline.rl.prompts import RLPrompt
from pipeline.sft.candidates import ParsedCandidate, parse_candidate, parse_direct

if TYPE_CHECKING:
    from pipeline.rewards.semantic import SemanticScorer

SCALE = 25.0  # SPEC: the rubric reward is mean x 5 on 1-5 criteria; the rule reward's 0/1 scaled alike


def rubric_reward(verdict) -> float:
    """A judge's verdict on the reward scale: mean of the five criteria x 5, or 0 for an invalid answer."""
    return verdict.score * 5.0 if verdict.valid else 0.0


def control_reward(kind: str, prediction: str, reference: str) -> float:
    """The offline reward of a control prompt: 25 when the prediction carries out the instruction in the
    environment's form (JSON where it answers JSON), 15 in another form, 0 when it does not obey
    (pipeline/rl/controls.py `obeys`). The semantic score would compare it with a reference that has no
    fault, and reward copying it."""
    if not obeys(kind, prediction, reference):
        return 0.0
    return SCALE if is_json(prediction) == is_json(reference) else 0.6 * SCALE


def semantic_reward(similarity) -> float:
    """The offline judge's score on the reward scale. Graded, not RWML's all-or-nothing cut: at a cut of
    0.5 an observation wrong by one byte and a restatement of the command would tie at 0, and a group
    of tied completions teaches nothing (README, RL: rewards)."""
    return SCALE * similarity.value


class Rewards:
    """The reward functions of one run, sharing the decoded, parsed completions of each batch."""

    def __init__(self, prompts: Sequence[RLPrompt], tokenizer, config: RewardConfig, judge=None, thinking: bool = True):
        self.prompts = list(prompts)
        self.tokenizer = tokenizer
        self.config = config
        self.judge = judge  # pipeline/rl/judge.py RubricJudge for kind `llm`
        self.thinking = thinking  # the answer format the completions are read in
        self._scorer: SemanticScorer | None = None

    @property
    def main_name(self) -> str:
        return "rubric" if self.config.judge.kind == "llm" else "semantic"

    def functions(self) -> list:
        """[main, rule], in the order of `weights`; TRL logs each under its function's name
        (rewards/rubric|semantic|rule/mean)."""

        async def rubric(**kwargs):
            return await self._rubric(**kwargs)

        async def semantic(**kwargs):
            return await self._semantic(**kwargs)

        async def rule(**kwargs):
            return await self._rule(**kwargs)

        return [rubric if self.config.judge.kind == "llm" else semantic, rule]

    @property
    def weights(self) -> list[float]:
        return [self.config.main_weight, self.config.rule_weight]

    def parse(
        self, completion_ids: Sequence[Sequence[int]], texts: Sequence[str] | None = None
    ) -> list[ParsedCandidate]:
        """The completions (token ids, or `texts` already decoded) parsed in the run's answer format."""
        if texts is None:
            texts = self.tokenizer.batch_decode([list(ids) for ids in completion_ids], skip_special_tokens=True)
        return [parse_candidate(text) if self.thinking else parse_direct(text) for text in texts]

    def combined(self, texts: Sequence[str], prompt_index: Sequence[int]) -> list[dict[str, float | None]]:
        """Each text's rewards as training computes them (the main reward, the rule reward where it applies,
        their weighted sum, a reward that does not apply adding nothing), for RL's before/after measure on
        its own prompts."""
        functions = self.functions()
        main, rule = (
            asyncio.run(
                f(
                    prompts=None,
                    completions=None,
                    completion_ids=None,
                    texts=list(texts),
                    prompt_index=list(prompt_index),
                )
            )
            for f in functions
        )
        return [
            {"main": m, "rule": r, "combined": self.config.main_weight * m + self.config.rule_weight * (r or 0.0)}
            for m, r in zip(main, rule)
        ]

    async def _rubric(
        self, prompts, completions, completion_ids, prompt_index, log_metric=None, texts=None, **_
    ) -> list[float]:
        parsed = self.parse(completion_ids, texts)
        usable = [i for i, p in enumerate(parsed) if p.ok]
        verdicts = await self.judge.score([(self.prompts[prompt_index[i]], parsed[i].prediction) for i in usable])
        rewards = [0.0] * len(parsed)
        for i, verdict in zip(usable, verdicts):
            rewards[i] = rubric_reward(verdict)
        if log_metric is not None:
            failures = sum(1 for v in verdicts if not v.valid)
            log_metric("judge/failure_rate", failures / len(verdicts) if verdicts else 0.0)
            self._log_common(log_metric, parsed, prompt_index)
        return rewards

    async def _semantic(
        self, prompts, completions, completion_ids, prompt_index, log_metric=None, texts=None, **_
    ) -> list[float]:
        parsed = self.parse(completion_ids, texts)
        rewards = [0.0] * len(parsed)
        usable = [i for i, p in enumerate(parsed) if p.ok and not self.prompts[prompt_index[i]].control]
        for i, p in enumerate(parsed):
            prompt = self.prompts[prompt_index[i]]
            if p.ok and prompt.control:  # the reference lacks the fault: the instruction's rule scores it
                rewards[i] = control_reward(prompt.control, p.prediction, prompt.reference)  # type: ignore[arg-type]  # ok: a prediction
        pairs = [
            (parsed[i].prediction, self.prompts[prompt_index[i]].reference, self.prompts[prompt_index[i]].action)
            for i in usable
        ]
        similarities = await asyncio.to_thread(self._similarities, pairs) if pairs else []
        for i, similarity in zip(usable, similarities):
            rewards[i] = semantic_reward(similarity)
        if log_metric is not None:
            self._log_common(log_metric, parsed, prompt_index)
        return rewards

    def _similarities(self, pairs):
        if self._scorer is None:
            from pipeline.rewards.semantic import SemanticScorer

            self._scorer = SemanticScorer()
        return self._scorer.similarities(pairs)

    def _log_common(self, log_metric, parsed: list[ParsedCandidate], prompt_index) -> None:
        log_metric("completions/missing_tags_rate", sum(1 for p in parsed if not p.ok) / len(parsed))
        log_metric("prompts/control_rate", sum(1 for i in prompt_index if self.prompts[i].control) / len(prompt_index))
        controlled = [(p, self.prompts[i]) for p, i in zip(parsed, prompt_index) if self.prompts[i].control]
        if controlled:  # instruction-following by the rule of each kind, whichever judge rewards it
            # cast: an ok candidate has a prediction.
            followed = sum(
                1
                for p, prompt in controlled
                if p.ok and obeys(prompt.control, cast(str, p.prediction), prompt.reference)
            )
            log_metric("control/following_rate", followed / len(controlled))

    async def _rule(
        self, prompts, completions, completion_ids, prompt_index, log_metric=None, texts=None, **_
    ) -> list[float | None]:
        from pipeline.rewards.rule import FAIL_REWARD, rule_rewards

        parsed = self.parse(completion_ids, texts)
        # A verifier checks the observation the environment really returned; a prompt with a control
        # instruction asks for a different one (an error, a first page), so there the rule does not apply.
        verifiers = [None if self.prompts[i].control else self.prompts[i].verifier for i in prompt_index]
        # A completion without its tags has no prediction to verify: 0, as for the main reward.
        runnable = [i for i, (code, p) in enumerate(zip(verifiers, parsed)) if code is not None and p.ok]
        outcomes = (
            await asyncio.to_thread(
                rule_rewards,
                [verifiers[i] for i in runnable],
                [parsed[i].prediction for i in runnable],  # type: ignore[misc]  # runnable: ok
                self.config.sandbox,
            )
            if runnable
            else []
        )
        rewards: list[float | None] = [None if code is None else FAIL_REWARD for code in verifiers]
        for i, outcome in zip(runnable, outcomes):
            rewards[i] = outcome.reward
        if log_metric is not None:
            covered = sum(1 for code in verifiers if code is not None)
            log_metric("rule/coverage", covered / len(verifiers))
            if covered:
                log_metric("rule/pass_rate", sum(1 for r in rewards if r == SCALE) / covered)
        return rewards
