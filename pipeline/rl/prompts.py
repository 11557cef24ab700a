"""RL prompts: the rl pool's target turns, one per trajectory, in the RL template.

SPEC.md's echo trap: samples expanded from one trajectory share long prefixes and correlated
rewards, which collapses RL diversity, so the rl pool has exactly one target turn per trajectory
(split.rl_targets) and `select_targets` refuses anything else rather than train on it.

A prompt carries what the rewards need next to the conversation: the reference observation, the
turn's verifier code (ingestion keeps it in the turn's metadata) and its control instruction.
Prompts are written once, by the main process, to `prompts.jsonl` in the run folder; every training
process reads that file (none touches the store).
"""

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.prompts.rl import rl_messages
from pipeline.rewards.rule import verifier_of
from pipeline.rl.controls import CONTROLS, draw_control
from pipeline.sft.queries import Query, choose_targets


class EchoTrap(UserFixableError):
    """Two target turns of one trajectory in the RL prompts."""


@dataclass(frozen=True, slots=True)
class RLPrompt:
    prompt_index: int
    trajectory_id: str
    turn_index: int
    domain: str
    messages: list[dict[str, str]]
    reference: str
    verifier: str | None
    control: str | None  # a CONTROLS kind

    @property
    def control_instruction(self) -> str | None:
        return CONTROLS[self.control] if self.control else None

    @property
    def action(self) -> str:
        """The target action: the conversation's last message (rl_messages)."""
        return self.messages[-1]["content"]


def select_targets(targets: Sequence[tuple[str, int]], limit: int | None, seed: int) -> list[tuple[str, int]]:
    """The seeded choice of `limit` rl targets, after checking there is one per trajectory."""
    per_trajectory = Counter(trajectory_id for trajectory_id, _ in targets)
    repeated = [trajectory_id for trajectory_id, count in per_trajectory.items() if count > 1]
    if repeated:
        raise EchoTrap(
            f"{len(repeated)} trajectories have several rl target turns (e.g. {repeated[0]}): RL takes one turn per "
            "trajectory (SPEC's echo trap); set split.rl_targets.strategy to `one` and rerun `simulacra split`"
        )
    return choose_targets(targets, limit, seed)


def verifiers(store, targets: Sequence[tuple[str, int]]) -> dict[tuple[str, int], str]:
    """The verifier code of the target turns that carry one (turn metadata `verifier`)."""
    rows = store.execute(
        "SELECT u.trajectory_id, u.turn_index, u.metadata FROM turns u "
        "JOIN (SELECT unnest(?::VARCHAR[]) AS trajectory_id, unnest(?::INTEGER[]) AS turn_index) t "
        "USING (trajectory_id, turn_index) WHERE u.metadata IS NOT NULL",
        [[t for t, _ in targets], [i for _, i in targets]],
    ).fetchall()
    found = {}
    for trajectory_id, turn_index, metadata in rows:
        code = verifier_of(json.loads(metadata) if isinstance(metadata, str) else metadata)
        if code is not None:
            found[(trajectory_id, turn_index)] = code
    return found


def verified_turns(store, pool: str) -> list[tuple[str, int]]:
    """(trajectory, turn) of every kept turn of the pool's trajectories whose metadata carries a verifier."""
    rows = store.execute(
        "SELECT u.trajectory_id, u.turn_index, u.metadata FROM kept_turns u JOIN splits s USING (trajectory_id) "
        "WHERE s.pool = ? AND u.metadata IS NOT NULL ORDER BY 1, 2",
        [pool],
    ).fetchall()
    return [
        (trajectory_id, turn_index)
        for trajectory_id, turn_index, metadata in rows
        if verifier_of(json.loads(metadata) if isinstance(metadata, str) else metadata) is not None
    ]


def build_prompts(
    queries: Sequence[Query],
    verifier_code: dict[tuple[str, int], str],
    control_fraction: float,
    seed: int,
    thinking: bool = True,
) -> list[RLPrompt]:
    """The prompts in RL's template, asking for the thinking or the direct format (`answers.thinking`)."""
    prompts = []
    for index, query in enumerate(queries):
        control = draw_control(seed, query.trajectory_id, control_fraction)
        prompts.append(
            RLPrompt(
                index,
                query.trajectory_id,
                query.turn_index,
                query.domain,
                rl_messages(
                    query.domain,
                    query.system,
                    query.history,
                    query.action,
                    CONTROLS[control] if control else None,
                    thinking,
                ),
                query.reference,
                verifier_code.get((query.trajectory_id, query.turn_index)),
                control,
            )
        )
    return prompts


def prompt_tokens(tokenizer, messages: Sequence[dict[str, str]]) -> int:
    """A prompt's length as GRPOTrainer tokenises it: the chat template with the generation prompt."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def write_prompts(path: Path, prompts: Sequence[RLPrompt]) -> None:
    from pipeline.store.atomic_files import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(asdict(prompt), ensure_ascii=False) + "\n" for prompt in prompts))


def read_prompts(path: Path) -> list[RLPrompt]:
    with path.open(encoding="utf-8") as handle:
        return [RLPrompt(**json.loads(line)) for line in handle if line.strip()]
