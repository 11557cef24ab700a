"""The activation checkpointing settings of a `TrainingArguments` class, under whichever name it knows.

transformers 5.24 renamed `gradient_checkpointing(_kwargs)` to `activation_checkpointing(_kwargs)` and
warns on the old names; earlier 5.x (the GPU image's 5.17) knows only the old ones and refuses the new
(`TypeError: unexpected keyword argument`), and pyproject allows `transformers>=5.0`. CPT and SFT
(transformers' TrainingArguments) and RL (TRL's GRPOConfig, a subclass) ask here, so one check
covers every stage.
"""

from typing import Any


def activation_checkpointing_arguments(arguments_class: type, enabled: bool) -> dict[str, Any]:
    """Keyword arguments for `arguments_class(...)` that turn activation checkpointing on or off.

    On, it is non-reentrant: the variant PyTorch recommends, and the one that works when the inputs need
    no gradient (the embeddings' output of a frozen or resized model)."""
    fields = getattr(arguments_class, "__dataclass_fields__", {})
    name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    arguments: dict[str, Any] = {name: enabled}
    if enabled:
        arguments[f"{name}_kwargs"] = {"use_reentrant": False}
    return arguments
