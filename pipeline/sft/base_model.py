"""Which model SFT starts from: `sft.base_model`, or else the CPT checkpoint registered in `checkpoints`."""

from pipeline.errors import UserFixableError


class NoCPTCheckpoint(UserFixableError):
    """SFT defaults to the CPT checkpoint and none is registered."""


def registered_cpt_checkpoint(store) -> str | None:
    """The newest registered CPT checkpoint whose folder still exists (the `checkpoints` table)."""
    from pathlib import Path

    rows = store.rows("SELECT path FROM checkpoints WHERE stage = 'cpt' ORDER BY created_at DESC, checkpoint_id")
    return next((row["path"] for row in rows if (Path(row["path"]) / "config.json").is_file()), None)


def sft_base_ref(config, store) -> str:
    if config.sft.base_model is not None:
        return config.sft.base_model
    found = registered_cpt_checkpoint(store)
    if found is None:
        if gone := store.scalar("SELECT path FROM checkpoints WHERE stage = 'cpt' ORDER BY created_at DESC LIMIT 1"):
            raise NoCPTCheckpoint(
                f"sft starts from the CPT checkpoint, and the one registered ({gone}) is no longer on disk: "
                "run `simulacra cpt` (it says how to train it again), or set sft.base_model"
            )
        raise NoCPTCheckpoint(
            "sft starts from the CPT checkpoint and none is registered: run `simulacra cpt` first, or set sft.base_model"
        )
    return found
