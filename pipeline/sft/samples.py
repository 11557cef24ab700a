"""SFT training sequences in the thinking format (SPEC.md, Stage 2), ChatML as CPT's:

    <|im_start|>system\\n{one of the ten SFT templates}<|im_end|>\\n
    <|im_start|>user\\n{action}<|im_end|>\\n <|im_start|>assistant\\n{observation}<|im_end|>\\n   (kept history)
    <|im_start|>user\\n{target action}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n{thinking}\\n</think>\\n\\n{observation}<|im_end|>\\n

History observations carry no thinking (real trajectories have none, and Qwen3's template drops
the thinking of earlier turns too). Labels: the target assistant output, its `<think>` block,
its observation and the `<|im_end|>` that ends it; the system prompt, the actions and the role
headers are context (-100). Pieces are tokenised separately and joined, as in CPT
(pipeline/training/sequences.py), so the label boundary is exact.

The kept history's observations are context too, unless `label_history` (direct SFT, issue 28): there
every assistant turn of the sample is a real observation in the very format the model is trained to
answer in, so each is a label with its `<|im_end|>`, as chat SFT trains every assistant turn. A sample
is mostly prompt (the demo's: about 400 tokens around a 19-token observation), so the target alone
labels a twentieth of what a step pays for; its history's observations multiply that at no cost. In
the thinking format they stay context: an observation that follows the header directly would teach a
thinking model to answer without thinking.

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
    history_labels: int = 0  # labels on history observations (`label_history`), beside the target's


def sft_sequence(
    builder: SequenceBuilder,
    source: str,
    system_prompt: str,
    history: Sequence[ScoredTurn],
    action: str,
    target: str,
    turn_index: int,
    label_history: bool = False,
) -> SampleSequence:
    texts = [system_prompt, action, target] + [text for turn in history for text in (turn.action, turn.observation)]
    encoded = builder.encode(texts)
    system_ids, action_ids, target_ids = encoded[0], encoded[1], encoded[2]
    user, assistant, footer = builder.headers["user"], builder.headers["assistant"], builder.footer
    system = builder.headers["system"] + system_ids + footer
    # Each history turn laid out and labelled as CPT's (its observation and end token); labels used or not below.
    turns = [
        builder.turn_block(source, turn, encoded[3 + 2 * i], encoded[4 + 2 * i], full_labels=True)
        for i, turn in enumerate(history)
    ]
    prompt_tail = user + action_ids + footer + assistant
    target_block = target_ids + footer
    fixed = len(system) + len(prompt_tail) + len(target_block)
    if fixed > builder.max_length:
        return SampleSequence(None, len(history))
    room = builder.max_length - fixed
    dropped = 0
    while turns and sum(len(block.ids) for block in turns) > room:
        turns.pop(0)
        dropped += 1
    context, labels = list(system), [IGNORE_INDEX] * len(system)
    for block in turns:
        context += block.ids
        labels += block.labels if label_history else [IGNORE_INDEX] * len(block.ids)
    history_labels = sum(1 for label in labels if label != IGNORE_INDEX)
    context += prompt_tail
    # Labelled: the target and its <|im_end|>; the newline after it belongs to no turn.
    labels += [IGNORE_INDEX] * len(prompt_tail) + target_ids + [builder.im_end] + [IGNORE_INDEX] * (len(footer) - 1)
    sequence = TokenSequence(context + target_block, labels, source, "sft", [turn_index])
    return SampleSequence(sequence, dropped, history_labels)


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
