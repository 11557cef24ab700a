"""Simulators: anything that answers a batch of (system prompt, history, action, domain) with observations.

A rollout (pipeline/fidelity/rollouts.py) asks a simulator once per step, every trajectory that has that step
in one batch, and never shows it the real observation it is scored against: a `SimulatorRequest` holds what
an agent's environment would be given, and nothing else. Two simulators:

- `ChatSimulator`: a chat model through the project's LLM client (pipeline/llm/client.py: a local model
  decodes the batch together; an endpoint gets concurrent requests), asked as evaluation asks it
  (pipeline/evaluation/prompting.py: the template and answer format the model was trained in, or a benchmark
  row's own system prompt), its answer parsed in that format. Every answer is cached in the store by its
  request, so a rerun after a kill asks nothing it had answered. In the closed loop a step's request is made
  of earlier answers, which a rerun reads back from the same cache: it rebuilds the same requests step after
  step, whatever the sampling, and finds them answered. Greedy decoding (temperature 0, evaluation's default)
  is still what a fidelity measure wants: a score that does not depend on a draw.
- `ServedSimulator`: a `ChatSimulator` of a model behind `simulacra serve` (the fidelity stage serves each model),
  which refuses a prompt past the model's context length (HTTP 400) rather than cutting it, as it refuses an
  agent's. That refusal is the simulator's answer, the same at every run, not the endpoint failing: the step gets
  status `context_exceeded` and is scored as the empty observation (evaluation's rule for an answer that yields
  none), and the closed loop goes on from it. Any other failed request is the endpoint's: too many of a call's
  (`max_failed_fraction`) stop the rollout, as `ChatSimulator` does.
- `RetrievalSimulator`: the retrieval baseline (pipeline/sft/retrieval.py: the observation of the most similar
  cpt-pool turn, by the action and the last turns of the history), a world model that has learnt nothing
  beyond recall; in the closed loop its own earlier answers are part of what it matches on.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipeline.evaluation.prompting import extract_observation, query_messages
from pipeline.evaluation.scoring import GENERATION_FAILED, Prediction
from pipeline.sft.queries import Query
from pipeline.store.schema import ScoredTurn, SystemPrompt

if TYPE_CHECKING:
    from pipeline.llm.client import ChatClient


@dataclass(frozen=True, slots=True)
class SimulatorRequest:
    """One step as a simulator sees it: the trajectory and turn it stands for, the system prompt (a
    benchmark row's own where it has one), the history (in the closed loop, the simulator's own earlier
    observations), and the action."""

    trajectory_id: str
    turn_index: int
    domain: str
    system: SystemPrompt
    own_system_prompt: str | None
    history: tuple[ScoredTurn, ...]
    action: str

    def as_query(self) -> Query:
        """The request as the query type prompting and retrieval read; its reference is blank: the real
        observation is not the simulator's to see."""
        return Query(self.trajectory_id, self.turn_index, self.domain, self.system, self.history, self.action, "", 0)


class Simulator(Protocol):
    name: str  # a table's row name

    def observations(self, requests: Sequence[SimulatorRequest]) -> list[Prediction]:
        """One prediction per request, in order: the parse status, the observation (None where none
        parsed or the generation failed), the thinking, the error of a failed generation."""
        ...


class ChatSimulator:
    """A chat model in the answer format it was trained in (`prompt_format`: pipeline/prompts/answer_format.py)."""

    def __init__(self, name: str, client: "ChatClient", prompt_format: str):
        self.name = name
        self.client = client
        self.prompt_format = prompt_format

    def observations(self, requests: Sequence[SimulatorRequest]) -> list[Prediction]:
        from pipeline.llm.client import ChatRequest

        answers = self.client.complete_sync(
            [
                ChatRequest(query_messages(request.as_query(), self.prompt_format, request.own_system_prompt))
                for request in requests
            ]
        )
        # As evaluation: more than `max_failed_fraction` of the requests failed is the endpoint's failure, raised
        # now rather than after a rollout of failures.
        self.client.check_failures()
        predictions = []
        for answer in answers:
            status, observation, thinking = extract_observation(answer.text, self.prompt_format)
            predictions.append(Prediction(status, observation, thinking, answer.error))
        return predictions


CONTEXT_EXCEEDED = "context_exceeded"  # the server refused the prompt: longer than the model's context


class ServedSimulator(ChatSimulator):
    """A chat model behind `simulacra serve`, its context refusals answers (module docstring). Its client is opened
    with a `max_failed_fraction` of 1, so that only this class decides which failures count."""

    def __init__(self, name: str, client: "ChatClient", prompt_format: str, max_failed_fraction: float):
        super().__init__(name, client, prompt_format)
        self.max_failed_fraction = max_failed_fraction

    def observations(self, requests: Sequence[SimulatorRequest]) -> list[Prediction]:
        from pipeline.llm.client import EndpointFailed

        predictions = [
            Prediction(CONTEXT_EXCEEDED, None, None, p.error)
            if p.status == GENERATION_FAILED and "context length" in (p.error or "").lower()
            else p
            for p in super().observations(requests)
        ]
        failed = [p.error for p in predictions if p.status == GENERATION_FAILED]
        if len(failed) > self.max_failed_fraction * len(predictions):
            raise EndpointFailed(
                f"{self.name}: {len(failed)} of {len(predictions)} requests to {self.client.describe()} failed (more "
                f"than max_failed_fraction {self.max_failed_fraction:.0%}), e.g. {' '.join((failed[0] or '').split())[:300]}: "
                "fix the server and rerun; failed requests are asked again"
            )
        return predictions


class RetrievalSimulator:
    """The retrieval baseline over the snapshot's cpt pool, with `history_turns` turns of history in its key."""

    def __init__(self, snapshot_dir: Path, history_turns: int, name: str = "retrieval baseline"):
        from pipeline.sft.retrieval import RetrievalIndex

        self.name = name
        self.index = RetrievalIndex(snapshot_dir, history_turns)

    def observations(self, requests: Sequence[SimulatorRequest]) -> list[Prediction]:
        found = self.index.neighbours([request.as_query() for request in requests], 1)
        return [Prediction("ok", nearest[0][0].observation, None, None) for nearest in found]
