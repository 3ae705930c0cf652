"""Compatibility: selection strategies, now in :mod:`streams.core.select`.

``streams.select`` is a documented import path, kept as a thin re-export.

May import: the module it re-exports.
"""

from streams.core.select import *  # noqa: F403
from streams.core.select import __all__ as __all__
