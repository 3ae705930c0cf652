"""Compatibility: reward functions and ``RewardResult``, now in :mod:`streams.core.rewards`.

``streams.rewards`` is a documented import path, kept as a thin re-export.

May import: the module it re-exports.
"""

from streams.core.rewards import *  # noqa: F403
from streams.core.rewards import __all__ as __all__
