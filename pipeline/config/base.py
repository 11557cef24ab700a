"""The base every configuration section derives from.

Each section is a pydantic model whose fields carry a ``description`` saying what the field does
and why its default is what it is (the habit of TRL's ``GRPOConfig``). ``extra="forbid"`` makes a
misspelt key an error instead of a silently ignored setting.
"""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
