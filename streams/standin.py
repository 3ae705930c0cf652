"""Compatibility: the Trinity stand-in, now in :mod:`streams.devtools.standin`.

``streams.standin`` is a documented import path, kept as a thin re-export.

May import: the module it re-exports.
"""

from streams.devtools.standin import *  # noqa: F403
from streams.devtools.standin import __all__ as __all__
