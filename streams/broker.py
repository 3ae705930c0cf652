"""Compatibility: the local Kafka broker, now in :mod:`streams.devtools.broker`.

``streams.broker`` is a documented import path, kept as a thin re-export.

May import: the module it re-exports.
"""

from streams.devtools.broker import *  # noqa: F403
from streams.devtools.broker import __all__ as __all__
