"""The verdict: may this model run with the tested KV-cache configuration? Pure; reads evidence only.

One job per module (the rules of the verdict: `evaluate.py`'s docstring):

- `verdict`: the records (Check, Reason, Verdict), the statuses (PASS, FAIL, INCONCLUSIVE, NOTE,
  NOT_STARTED) and the exit codes (EXIT_*, exit_code).
- `thresholds`: the limits: platform profiles (Budget, PROFILES, DEFAULT_PROFILE), Thresholds, and
  load_thresholds (stored limits < YAML < overrides; GateConfigError).
- `evaluate`: evaluate(evidence) -> Verdict, from the checks of the modules below.
- `divergence_checks`, `degeneration_checks`, `task_checks`: the evidence of one tested cell judged.
- `defects`: engine-path defects (a defective cell's FAIL becomes INCONCLUSIVE); `attribution`: plain
  FP8 whose harm the diagnosed layers explain.
- `collector`: what the checks share (_Collector, short figures for sentences).

The names importers use are re-exported here: `from kveval.gate import Thresholds, evaluate` keeps working.
"""
from __future__ import annotations

from kveval.gate.collector import _Collector
from kveval.gate.defects import KEPT_LAYERS_DEFECTIVE_BACKEND, KNOWN_ENGINE_DEFECTS
from kveval.gate.degeneration_checks import _degeneration
from kveval.gate.evaluate import evaluate
from kveval.gate.thresholds import DEFAULT_PROFILE, PROFILES, Budget, GateConfigError, Thresholds, load_thresholds
from kveval.gate.verdict import (
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    EXIT_USAGE,
    FAIL,
    INCONCLUSIVE,
    NOT_STARTED,
    NOTE,
    PASS,
    REASON_CODES,
    Check,
    Reason,
    Verdict,
    exit_code,
)

__all__ = [
    "EXIT_FAIL", "EXIT_INCONCLUSIVE", "EXIT_PASS", "EXIT_USAGE", "FAIL", "INCONCLUSIVE", "NOT_STARTED", "NOTE", "PASS",
    "REASON_CODES", "Check", "Reason", "Verdict", "exit_code",
    "DEFAULT_PROFILE", "PROFILES", "Budget", "GateConfigError", "Thresholds", "load_thresholds",
    "evaluate", "KEPT_LAYERS_DEFECTIVE_BACKEND", "KNOWN_ENGINE_DEFECTS",
    # private, to run the degeneration check alone; scripts/simulate_gate.py, which runs every stream's check
    # alone, imports them (and _divergence, _tasks) from collector and the *_checks modules instead
    "_Collector", "_degeneration",
]
