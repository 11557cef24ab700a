"""RL's log-probabilities on a CPU computed at the completion's positions only, as on a GPU.

GRPOTrainer (TRL 1.16) replaces the policy's forward with a fused LM head (`trl.trainer.utils.add_fused_lm_head`)
that returns per-token log-probabilities and entropies without a [tokens x vocabulary] logits tensor. Where Triton
runs (CUDA, XPU) it projects only the positions with a label, the completion's tokens; everywhere else it projects
every position of prompt and completion, then zeroes the prompt's, so that a Neuron device, which compiles one
kernel per tile shape, sees the same shapes at every call. A CPU compiles nothing, and there the whole-row head was
a third of a GSPO step: the demo's RL prompts run to 512 tokens, its completions to 64, and the head's projection,
log-softmax and entropy over SmolLM2's 49,152-token vocabulary ran for every prompt token, forward and backward
(4 steps from the demo's SFT checkpoint: 63 s against 46 s with the labelled positions only, the same rewards and
the same trained model's rewards to the last digit; 2026-12-04).

`score_labelled_positions_only()` makes TRL's choice "labelled positions only" on a CPU too, for the whole process
(the RL stage's), and leaves every other device's choice as TRL makes it. The values at the labelled positions are
the same either way: the prompt's were zeroed before, and are never computed now.
"""

import logging

log = logging.getLogger(__name__)

# The name TRL's fused head asks whether to project the labelled positions only (`compact`), in trl.trainer.utils.
CHOICE = "_use_triton"


def score_labelled_positions_only() -> bool:
    """TRL's fused LM head projects the labelled positions only on a CPU as well; False where this TRL makes the
    choice some other way (its head is then left as it is)."""
    from trl.trainer import utils

    choose = getattr(utils, CHOICE, None)
    if choose is None or not callable(choose):
        log.info("rl: trl.trainer.utils has no %s; its fused LM head is left as it is", CHOICE)
        return False
    if getattr(choose, "labelled_on_cpu", False):
        return True

    def compact(device) -> bool:
        return device.type == "cpu" or choose(device)

    compact.labelled_on_cpu = True  # type: ignore[attr-defined]
    compact.trl_choice = choose  # type: ignore[attr-defined]  # TRL's own, for whoever must see it
    setattr(utils, CHOICE, compact)
    return True
