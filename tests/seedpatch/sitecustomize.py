"""Seed sweeps for the stochastic tests: imported at start-up by every Python process that
``tests/seed_sweep.py`` launches (it puts this folder first on ``PYTHONPATH``), so the
pytest process and every broker, party or coordinator it starts see the same changes:

- ``PSFL_SWEEP_SEED`` (an integer, 0 = unchanged): every integer seed given to
  ``numpy.random.default_rng``, ``numpy.random.seed``, ``random.seed`` and
  ``torch.manual_seed`` is replaced by a different one derived from it and the sweep seed,
  so a test's fixed seeds (and the product's, from its configuration) all move together;
- ``PSFL_SWEEP_TORCH_THREADS`` (an integer): torch's intra-op threads, whatever the code
  asks for (another reduction order: another floating-point path);
- ``PSFL_SWEEP_DETERMINISTIC=1``: ``torch.use_deterministic_algorithms(True)``.

Never imported by the product or by an ordinary test run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_SEED = int(os.environ.get("PSFL_SWEEP_SEED", "0") or 0)
_THREADS = int(os.environ.get("PSFL_SWEEP_TORCH_THREADS", "0") or 0)
_DETERMINISTIC = os.environ.get("PSFL_SWEEP_DETERMINISTIC", "") == "1"


def _moved(seed: object) -> object:
    """An integer seed moved by the sweep seed (a bijection for a fixed sweep seed)."""
    if _SEED and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return (seed * 1_000_003 + _SEED * 7_919) % (2**32)
    return seed


def _patch_numpy() -> None:
    import numpy as np

    orig_rng, orig_seed = np.random.default_rng, np.random.seed

    def default_rng(seed=None):  # noqa: ANN001, ANN202
        return orig_rng(_moved(seed))

    def seed_(seed=None):  # noqa: ANN001, ANN202
        return orig_seed(_moved(seed))

    np.random.default_rng = default_rng
    np.random.seed = seed_


def _patch_random() -> None:
    import random

    orig = random.seed

    def seed_(a=None, version=2):  # noqa: ANN001, ANN202
        return orig(_moved(a), version)

    random.seed = seed_


def _patch_torch(torch) -> None:  # noqa: ANN001
    orig_seed, orig_threads = torch.manual_seed, torch.set_num_threads

    def manual_seed(seed):  # noqa: ANN001, ANN202
        return orig_seed(_moved(int(seed)))

    torch.manual_seed = manual_seed
    if _THREADS:
        orig_threads(_THREADS)
        torch.set_num_threads = lambda n: None  # noqa: ARG005
    if _DETERMINISTIC:
        torch.use_deterministic_algorithms(True)


class _TorchHook(importlib.abc.MetaPathFinder):
    """Patches torch right after it is first imported (not at start-up: it is heavy)."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001, ANN201
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):  # noqa: ANN001, ANN202
            exec_module(module)
            _patch_torch(module)

        loader.exec_module = exec_and_patch
        return spec


if _SEED or _THREADS or _DETERMINISTIC:
    _patch_numpy()
    _patch_random()
    sys.meta_path.insert(0, _TorchHook())
