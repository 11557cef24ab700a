"""Which model SFT starts from: `sft.base_model`, or else the CPT checkpoint registered in `checkpoints`."""

from pipeline.errors import UserFixableError
from pipeline.training.runs import newest_registered_path, registered_checkpoint


class NoCPTCheckpoint(UserFixableError):
    """SFT defaults to the CPT checkpoint and none is registered."""


def sft_base_ref(config, store) -> str:
    if config.sft.base_model is not None:
        return config.sft.base_model
    found = registered_checkpoint(store, "cpt")
    if found is None:
        if gone := newest_registered_path(store, "cpt"):
            raise NoCPTCheckpoint(
                f"sft starts from the CPT checkpoint, and the one registered ({gone}) is no longer on disk: "
                "run `simulacra cpt` (it says how to train it again), or set sft.base_model"
            )
        raise NoCPTCheckpoint(
            "sft starts from the CPT checkpoint and none is registered: run `simulacra cpt` first, or set sft.base_model"
        )
    return found
