"""Compatibility: the Python SDK, now in :mod:`streams.capture.sdk`.

``streams.sdk`` is a documented import path, kept as a thin re-export.

May import: the module it re-exports.
"""

from streams.capture.sdk import *  # noqa: F403
from streams.capture.sdk import __all__ as __all__
