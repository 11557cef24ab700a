"""A training run whose weights stopped being numbers fails, instead of registering them.

`cpt.learning_rate: .inf` (since refused by the config) trained to NaN weights, reported "validation observation CE
6.238 -> nan", registered the checkpoint, and SFT trained on from it with status 0. A finite rate too large does the
same. A loss that is not finite at some step is not enough on its own: under fp16 the loss scaler skips such steps
and the weights stay whole; the weights are what is saved, so they are what is checked.
"""

import math

from pipeline.errors import UserFixableError


class TrainingDiverged(UserFixableError):
    """The weights after training hold NaN or inf; the message names the learning rate to lower."""


def refuse_diverged_weights(trainer, stage: str, learning_rate: float) -> None:
    """Raises TrainingDiverged where any parameter this process holds is not finite (under ZeRO-3 its shard).
    Called before the trained weights are saved, so nothing diverged is published or registered."""
    import torch

    with torch.no_grad():
        broken = next(
            (name for name, values in trainer.model.named_parameters() if not torch.isfinite(values).all()), None
        )
    if broken is None:
        return
    history = trainer.state.log_history
    first = next((h["step"] for h in history if "loss" in h and not math.isfinite(h["loss"])), None)
    where = f"the loss not finite from step {first}, " if first is not None else ""
    raise TrainingDiverged(
        f"{stage} diverged: {where}weights not finite after step {trainer.state.global_step} (first: {broken}) at "
        f"{stage}.learning_rate {learning_rate:g}: lower the learning rate, then rerun; nothing was registered"
    )
