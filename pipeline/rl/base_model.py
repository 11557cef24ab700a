"""Which model RL starts from: `rl.base_model`, else the newest registered SFT checkpoint, else CPT's,
else `model.base` (or the workspace's tiny model, which the CPT stage builds)."""

from pathlib import Path

from pipeline.errors import UserFixableError
from pipeline.training.runs import registered_checkpoint


class NoBaseModel(UserFixableError):
    """RL has no model to start from."""


def rl_base_ref(config, store) -> str:
    from pipeline.training.models import base_model_ref, ensure_base_model

    if config.rl.base_model is not None:
        return config.rl.base_model
    for stage in ("sft", "cpt"):
        if (found := registered_checkpoint(store, stage)) is not None:
            return found
    if config.model.base is not None:
        return ensure_base_model(config)
    ref = base_model_ref(config)
    if config.model.base is None and not (Path(ref) / "config.json").is_file():
        raise NoBaseModel(
            "rl starts from the SFT checkpoint, else CPT's, else model.base, and there is none: run `simulacra sft` "
            "(or `simulacra cpt`) first, or set rl.base_model or model.base"
        )
    return ref
