"""One exception tree: every error class the package raises on purpose is in streams.errors."""

from __future__ import annotations

import importlib
import pkgutil

import streams
from streams import errors

# where the input's own layer names what was wrong; they subclass a class of the tree
ELSEWHERE = {
    "streams.capture.otlp_decode.OtlpDecodeError",
    "streams.capture.apis.common.ApiRequestError",
}


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub} | _subclasses(sub)
    return out


def test_every_error_of_the_package_is_defined_in_errors() -> None:
    for mod in pkgutil.walk_packages(streams.__path__, "streams."):
        if not mod.name.startswith("streams.devtools"):
            importlib.import_module(mod.name)
    found = {f"{c.__module__}.{c.__qualname__}" for c in _subclasses(errors.TrajstreamError)}
    outside = {n for n in found if n.startswith("streams.") and not n.startswith("streams.errors.")}
    assert outside <= ELSEWHERE, sorted(outside - ELSEWHERE)
    assert set(errors.__all__) >= {n.rsplit(".", 1)[1] for n in found if "streams.errors." in n}


def test_one_base_for_http_services() -> None:
    for cls in (errors.TrinityError, errors.JudgeError, errors.TrinityGaveUp, errors.JudgeGaveUp):
        assert issubclass(cls, errors.ServiceError)
    gave_up = errors.TrinityGaveUp("gone", 3, body="503")
    assert (gave_up.attempts, gave_up.body, gave_up.status) == (3, "503", None)
    assert isinstance(gave_up, errors.TrinityError) and not gave_up.retriable
    assert errors.TrinityUnavailable("x").retriable and errors.JudgeUnavailable("x").retriable


def test_the_old_import_paths_still_work() -> None:
    from streams.core.judge import JudgeAnswerError
    from streams.export.dataset import ExportError
    from streams.io.trinity import TrinityGaveUp
    from streams.runtime.faust_patches import HandoverPatchError
    from streams.runtime.replay_options import ReplayError

    assert {JudgeAnswerError, ExportError, TrinityGaveUp, HandoverPatchError, ReplayError} <= {
        getattr(errors, n) for n in errors.__all__
    }
