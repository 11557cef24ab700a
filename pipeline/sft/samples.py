"""SFT training sequences in the thinking format (SPEC.md, Stage 2), ChatML as CPT's:

    <|im_start|>system\\n{one of the ten SFT templates}<|im_end|>\\n
    <|im_start|>user\\n{action}<|im_end|>\\n <|im_start|>assistant\\n{observation}<|im_end|>\\n   (kept history)
    <|im_start|>user\\n{target action}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{thinking}\\n</think>\\n\\n{observation}<|im_end|>\\n

History observations carry no thinking (real trajectories have none, and Qwen3's template drops
the thinking of earlier turns too). Labels: the target assistant output only, its `<think>` block,
its observation and the `<|im_end|>` that ends it; the system prompt, the history, the action and
the role headers are context (-100). Pieces are tokenised separately and joined, as in CPT
(pipeline/training/sequences.py), so the label boundary is exact.

A sample longer than `max_length` drops its oldest history turns, one at a time, until it fits
(counted); one whose system prompt, action and target alone exceed it is skipped (counted): cutting
the target would teach the model to stop mid-observation. `can_fit` asks the same of a query before
any candidate is generated for it, so a query that can never fit costs no generation.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.llm.thinking_format import render_thinking_output
from pipeline.store.schema import ScoredTurn
from pipeline.training.sequences import IGNORE_INDEX, SequenceBuilder, TokenSequence


@dataclass(frozen=True, slots=True)
class SampleSequence:
    sequence: TokenSequence | None  # None: too long even without history
    history_dropped: int


def sft_sequence(
    builder: SequenceBuilder,
    source: str,
    system_prompt: str,
    history: Sequence[ScoredTurn],
    action: str,
    target: str,
    turn_index: int,
) -> SampleSequence:
    texts = [system_prompt, action, target] + [text for turn in history for text in (turn.action, turn.observation)]
    encoded = builder.encode(texts)
    system_ids, action_ids, target_ids = encoded[0], encoded[1], encoded[2]
    user, assistant, footer = builder.headers["user"], builder.headers["assistant"], builder.footer
    system = builder.headers["system"] + system_ids + footer
    turns = [user + encoded[3 + 2 * i] + footer + assistant + encoded[4 + 2 * i] + footer for i in range(len(history))]
    prompt_tail = user + action_ids + footer + assistant
    target_block = target_ids + footer
    fixed = len(system) + len(prompt_tail) + len(target_block)
    if fixed > builder.max_length:
        return SampleSequence(None, len(history))
    room = builder.max_length - fixed
    dropped = 0
    while turns and sum(len(t) for t in turns) > room:
        turns.pop(0)
        dropped += 1
    context = system + [token for turn in turns for token in turn] + prompt_tail
    # Labelled: the target and its <|im_end|>; the newline after it belongs to no turn.
    labels = [IGNORE_INDEX] * len(context) + target_ids + [builder.im_end] + [IGNORE_INDEX] * (len(footer) - 1)
    return SampleSequence(TokenSequence(context + target_block, labels, source, "sft", [turn_index]), dropped)


def shortest_prompt(builder: SequenceBuilder, system_prompts: Sequence[str]) -> str:
    """The system prompt of fewest tokens among those a sample may draw (the ten templates rendered)."""
    lengths = [len(ids) for ids in builder.encode(list(system_prompts))]
    return system_prompts[lengths.index(min(lengths))]


def can_fit(builder: SequenceBuilder, shortest_system_prompt: str, action: str, reference: str) -> bool:
    """Whether a query can become a training sample at all, asked before anything is generated for it.

    Its smallest sample: the shortest system prompt a sample may draw (`shortest_prompt`), no history,
    and a thinking block with nothing in it before the real observation. When even that exceeds
    `max_length`, every candidate a generator writes for the query would be skipped as too long after it
    was paid for (the demo's tool-call queries: 1,225-1,596 tokens of tool schemas against rows of 512)."""
    empty_thinking = render_thinking_output("", reference)
    return sft_sequence(builder, "", shortest_system_prompt, (), action, empty_thinking, 0).sequence is not None
