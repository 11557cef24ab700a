"""The base every configuration section derives from.

Each section is a pydantic model whose fields carry a ``description`` saying what the field does
and why its default is what it is (the habit of TRL's ``GRPOConfig``). ``extra="forbid"`` makes a
misspelt key an error instead of a silently ignored setting. ``allow_inf_nan=False``: YAML reads `.inf`,
and `cpt.learning_rate: .inf` passed `gt=0`, trained to NaN and registered the checkpoint.
"""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)
