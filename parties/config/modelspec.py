"""Model specs of a VFL run as text, checked without torch (see :mod:`parties.models.zoo`).

Kept free of torch so that :mod:`parties.config` (imported by launchers) stays light.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

from pubsub.config import ConfigError

#: Built-in model names.
BUILTINS = ("mlp", "resnet")
#: Normalisation layers of the ``resnet`` model.
NORMS = ("layer", "batch", "group", "none")
#: ``vfl.dp_batchnorm`` choices.
DP_BATCHNORM = ("refuse", "groupnorm")
#: Most groups of a GroupNorm (``resnet_norm = "group"`` and the DP conversion): the
#: largest divisor of the width that is at most this.
GROUPS = 8


class ModelSpecError(ConfigError):
    """A model spec cannot be used: not importable, raising, or of the wrong widths.

    Attributes:
        value: the offending spec (its string or the callable's qualified name).
    """

    def __init__(self, key: str, value: object, why: str) -> None:
        self.value = value
        super().__init__(f"vfl.{key}", f"{value!r}: {why}")


def check_spec(key: str, value: str, *, allow_empty: bool = False) -> None:
    """Validate the form of a model spec string (no import): a built-in name or
    ``module:callable``.

    Raises:
        ModelSpecError: another form.
    """
    if value in BUILTINS or (allow_empty and value == ""):
        return
    mod, sep, fn = value.partition(":")
    if not sep or not mod or not fn or not all(p.isidentifier() for p in mod.split(".")) \
            or not all(p.isidentifier() for p in fn.split(".")):
        raise ModelSpecError(key, value, f"must be one of {BUILTINS} or 'package.module:"
                             "callable'" + (" (or empty)" if allow_empty else ""))


def import_callable(key: str, spec: str) -> Callable[..., Any]:
    """The callable named by ``module:attr`` (dotted attributes allowed).

    Raises:
        ModelSpecError: the module or attribute cannot be imported, or is not callable.
    """
    mod_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # noqa: BLE001 - any import failure is the spec's fault
        raise ModelSpecError(key, spec, f"cannot be imported ({type(exc).__name__}: {exc})"
                             ) from None
    if not callable(obj):
        raise ModelSpecError(key, spec, f"is a {type(obj).__name__}, not callable")
    return obj


def check_resnet_settings(depth: int, width: int, norm: str, dropout: float) -> str | None:
    """Why the ``resnet_*`` settings are invalid, or None."""
    if depth < 0:
        return "resnet_depth"
    if width < 1:
        return "resnet_width"
    if norm not in NORMS:
        return "resnet_norm"
    if not (0.0 <= dropout < 1.0) or math.isnan(dropout):
        return "resnet_dropout"
    return None


__all__ = ["BUILTINS", "DP_BATCHNORM", "GROUPS", "NORMS", "ModelSpecError",
           "check_resnet_settings", "check_spec", "import_callable"]
