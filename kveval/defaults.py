"""Every default of a kveval run, defined once: the CLI, the Python API and the run planner read them here."""
from __future__ import annotations

KV: tuple[str, ...] = ("fp8", "auto")                 # KV-cache configurations compared
MAX_MODEL_LEN: tuple[int, ...] = (2048, 8192, 32768)  # one cell per KV configuration x max_model_len
BASELINE_KV = "auto"                                  # the KV dtype every other configuration is judged against
SEED = 0
SUITE = "standard"                                    # kveval.inputs.suites.SUITES
# Every phase a cell can run (worker/phases.PHASES, which the architecture test keeps equal), in this
# order, and the default for every cell.
PHASES: tuple[str, ...] = ("generation", "scoring", "tasks", "speed", "throughput")
CELL_TIMEOUT_S = 3600.0                               # a cell is stopped after this long
# A started cell whose engine reports no progress (no finished step) for this long is stopped as stalled:
# on the H200 a kept-layer remedy cell once hung in scoring for over 5 minutes where plain FP8 took 4 s.
STALL_TIMEOUT_S = 600.0
# How the deploy answer ranks passing configurations (analysis/deploy_choice.py): the most KV (capacity),
# the best output tok/s against `auto` (throughput) or the least TTFT against it (latency).
PREFERENCES: tuple[str, ...] = ("capacity", "throughput", "latency")
PREFER = "capacity"
REMEDY = "auto"                                       # kveval.run.remedy.REMEDY_MODES
DIAGNOSE = True                                       # per-layer K/V range pass for FP8 runs
TASK_LENGTHS: tuple[float, ...] = (0.25, 0.5, 0.9)    # task prompt sizes as shares of max_model_len
TASK_DEPTHS: tuple[float, ...] = (0.1, 0.5, 0.9)      # needle depths in the haystack
RUNS_DIR = "runs"                                     # where a run directory goes without --out
