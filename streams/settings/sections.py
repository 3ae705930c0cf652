"""What every section of the settings shares.

May import: pydantic.
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    SecretStr,
)

PositiveInt = pydantic.PositiveInt


PositiveFloat = pydantic.PositiveFloat
PositiveInt = pydantic.PositiveInt


class Section(BaseModel):
    """A section of the settings; a misspelt key in a config file is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


def secret_value(v: Any) -> str:
    return v.get_secret_value() if isinstance(v, SecretStr) else str(v)
