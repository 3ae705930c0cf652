"""Loading user code named in the settings: ``package.module:attribute`` or an entry point.

Reward functions and selection strategies are plugins. A name with a colon is imported as
``module:attribute``; a bare name is looked up among the ``trajstream.rewards`` and
``trajstream.strategies`` entry points of installed packages.

May import: the standard library, :mod:`streams.errors`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from ..errors import ConfigError

__all__ = ["load_object"]

ENTRY_POINT_GROUPS = ("trajstream.rewards", "trajstream.strategies")


def load_object(name: str) -> object:
    """Import ``package.module:attr`` (or ``package.module.attr``), or find an entry point."""
    module_name, sep, attr = name.partition(":")
    if not sep:
        for group in ENTRY_POINT_GROUPS:
            for ep in entry_points(group=group):
                if ep.name == name:
                    return ep.load()
        module_name, _, attr = name.rpartition(".")
        if not module_name:
            raise ConfigError(f"cannot load {name!r}: use package.module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {name!r}): {exc}") from exc
    obj: object = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{module_name!r} has no attribute {attr!r} (from {name!r})"
            ) from None
    return obj
