"""Holds the fake engine's start (worker/fake_engine.py) for KVEVAL_TEST_HOLD_FAKE_START_S seconds, in
every Python process that inherits PYTHONPATH with this folder first: a real engine takes tens of
seconds to start and the fake one none, so a test that stops a run "while a cell's engine starts"
(tests/integration/test_ray_engine.py) needs this window. The cell has already emitted its
engine_start event when the hold begins. Nothing else changes: another sitecustomize later on the path
(tests/support/as_avx2) is still run."""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_HOLD_S = float(os.environ.get("KVEVAL_TEST_HOLD_FAKE_START_S") or 0)
_MODULE = "kveval.worker.fake_engine"


class _HoldFakeStart(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            start = module.Engine.start.__func__

            def held_start(cls, settings):
                time.sleep(_HOLD_S)
                return start(cls, settings)

            module.Engine.start = classmethod(held_start)

        spec.loader.exec_module = exec_module
        return spec


if _HOLD_S > 0:
    sys.meta_path.insert(0, _HoldFakeStart())

# Only the first sitecustomize on sys.path is imported: run the next one, if any, as Python would have.
_next = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE])
if _next is not None and _next.loader is not None:
    _module = importlib.util.module_from_spec(_next)
    _next.loader.exec_module(_module)
