"""Cross-entropy of each real observation under teacher forcing, per query (issue 12).

The sequence is the model's prompt in its own format (ChatML, as in CPT and SFT training), then the
assistant turn: its context prefix (pipeline/evaluation/prompting.py, `answer_prefix`) and the real
observation with its `<|im_end|>`. Only the observation and its end token are labelled; the loss is
the training path's (pipeline/training/token_loss.py: the model's forward replaced by the per-row
summed token losses over labelled positions, the same as the held-out CE of training), summed per
query with its token count, so an aggregate is per token (sum of losses / tokens, as CPT's held-out
CE) and long observations weigh by their length. Rows are right-padded, the padding a sequence of
its own (restarting positions), as the training collator lays packed rows out. A sequence longer than `max_length`
drops its oldest history turns; one that does not fit without history gets no cross-entropy.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.sft.queries import Query
from pipeline.training.sequences import IGNORE_INDEX, SequenceBuilder


@dataclass(frozen=True, slots=True)
class TeacherForced:
    input_ids: list[int]
    labels: list[int]


def teacher_forced_sequence(
    builder: SequenceBuilder, system_prompt: str, query: Query, prefix: str
) -> TeacherForced | None:
    texts = [system_prompt, query.action, prefix, query.reference]
    texts += [text for turn in query.history for text in (turn.action, turn.observation)]
    encoded = builder.encode(texts)
    system_ids, action_ids, prefix_ids, observation_ids = encoded[:4]
    user, assistant, footer = builder.headers["user"], builder.headers["assistant"], builder.footer
    system = builder.headers["system"] + system_ids + footer
    turns = [
        user + encoded[4 + 2 * i] + footer + assistant + encoded[5 + 2 * i] + footer for i in range(len(query.history))
    ]
    tail = user + action_ids + footer + assistant + (prefix_ids if prefix else [])
    target = observation_ids + [builder.im_end]
    room = builder.max_length - len(system) - len(tail) - len(target)
    if room < 0:
        return None
    while turns and sum(len(t) for t in turns) > room:
        turns.pop(0)
    context = system + [token for turn in turns for token in turn] + tail
    return TeacherForced(context + target, [IGNORE_INDEX] * len(context) + target)


class TeacherForcing:
    """A local checkpoint, loaded once, scoring sequences a batch at a time."""

    def __init__(self, model_path: str, max_length: int, batch_size: int, device: str = "auto"):
        from pipeline.llm.devices import resolve_device
        from pipeline.training.models import ensure_chatml_tokens, load_causal_lm, load_tokenizer
        from pipeline.training.token_loss import install_token_loss, resolve_loss_implementation

        device = resolve_device(device, "evaluate.predictor.device")
        self.tokenizer = load_tokenizer(model_path)
        ensure_chatml_tokens(self.tokenizer)
        self.model = load_causal_lm(model_path).to(device).eval()
        install_token_loss(self.model, resolve_loss_implementation("auto"))
        self.builder = SequenceBuilder(self.tokenizer, max_length, seed=0)
        self.batch_size = batch_size

    def losses(self, sequences: Sequence[TeacherForced | None]) -> list[tuple[float, int] | None]:
        """(sum of the observation tokens' cross-entropies, their number) per sequence; None stays None."""
        import torch

        from pipeline.training.packing import PackedCollator

        present = [i for i, sequence in enumerate(sequences) if sequence is not None]
        results: list[tuple[float, int] | None] = [None] * len(sequences)
        for start in range(0, len(present), self.batch_size):
            chosen: list[TeacherForced] = [sequences[i] for i in present[start : start + self.batch_size]]  # type: ignore[misc]  # present: not None
            rows = [
                {
                    "input_ids": s.input_ids,
                    "labels": s.labels,
                    "shift_labels": s.labels[1:] + [IGNORE_INDEX],
                    "position_ids": list(range(len(s.input_ids))),
                }
                for s in chosen
            ]
            batch = PackedCollator(self.tokenizer.pad_token_id, max(len(s.input_ids) for s in chosen))(rows)
            with torch.inference_mode():
                outputs = self.model(
                    **{
                        name: batch[name].to(self.model.device)
                        for name in ("input_ids", "position_ids", "shift_labels")
                    },
                    per_row=True,
                )
            for i, total, count in zip(
                present[start : start + self.batch_size],
                outputs["row_loss_sums"].tolist(),
                outputs["row_label_counts"].tolist(),
            ):
                results[i] = (float(total), int(count))
        return results
