"""Engine runs that more than one integration test reads (each is minutes of CI on a 2-core CPU)."""
from __future__ import annotations

import pytest

import kveval
from tests.support.quiet import Quiet

# Two `auto` cells, generation only, on the budget kveval chooses for a CPU: the evidence test reads
# its diff and scan, and the planted-degradation test compares its planted model's auto tokens with
# these. (The Ray test runs the same matrix on the fake engine, in a fixture of its own.)
TWO_AUTO_CELLS = dict(kv=["auto"], max_model_len=[512, 1024], enforce_eager=True, suite="quick",
                      phases=("generation",),
                      counts={"short_256": 2, "short_512": 0, "probe": 0, "ctx_1k": 0, "ctx_pct": 0, "over": 0})

# The real run of TWO_AUTO_CELLS also runs the long-context tasks after generation, for
# test_tasks_engine (CI time: its cells would be these two engines again): two tasks, at 50 % of
# max_model_len (fits) and 110 % (must be rejected, never truncated), one sample per point. Generation
# runs first and the budget depends only on the lengths and the throughput sweep (none here), so the
# tokens and the pool are those of TWO_AUTO_CELLS alone.
TASK_LENGTHS = (0.5, 1.1)
WITH_TASKS = dict(phases=("generation", "tasks"), tasks=["passkey", "niah_single"], task_lengths=TASK_LENGTHS,
                  task_depths=(0.5,), task_samples=1,
                  budget="0")  # one look: rounds are unit-tested and were run by hand (make demo)


@pytest.fixture(scope="session")
def two_auto_cells(tmp_path_factory, default_model_dir):
    return kveval.compare(out=tmp_path_factory.mktemp("two-auto") / "r", progress=Quiet(),
                          **{**TWO_AUTO_CELLS, **WITH_TASKS})


# test_compare_engine's 2 x 2 matrix (fp8, auto) x (1024, 2048) on 40 MiB, every phase; test_tasks_engine
# reads its fp8 and auto task samples for the paired comparison where the CPU runs FP8.
MATRIX_COUNTS = {"short_256": 1, "short_512": 0, "probe": 6, "ctx_1k": 0, "ctx_pct": 0, "over": 1}


@pytest.fixture(scope="session")
def fp8_auto_matrix(tmp_path_factory, default_model_dir):
    out = tmp_path_factory.mktemp("run") / "r"
    return kveval.compare(
        kv=["fp8", "auto"], max_model_len=[1024, 2048], out=out, kv_cache_memory="40MiB", enforce_eager=True,
        suite="quick", counts=MATRIX_COUNTS, speed_runs=1, speed_warmup=0, speed_max_tokens=8,
        tasks=("passkey",), progress=Quiet(),  # the tasks phase in the default order; test_tasks_engine covers it
        diagnose=False,  # the K/V range pass is covered by test_kv_ranges_model and test_remedy_engine (CI time)
        budget="0",  # one look: task rounds are unit-tested (test_task_rounds) and were run by hand (make demo)
        repeat_budget=0,  # one timed run per level, as speed_runs=1: repeats are tested in test_speed_repeats (CI time)
    )


@pytest.fixture(scope="session", autouse=True)
def one_kv_range_pass_per_input(tmp_path_factory):
    """The fake-engine runs that diagnose the same planted model on the same documents share one real K/V
    range pass (tests/support/kv_ranges_memo.py: ~70 s of CPU each on 2 cores); the first runs it."""
    from kveval.run import setup
    from tests.support.kv_ranges_memo import memoized

    patch = pytest.MonkeyPatch()
    patch.setattr(setup, "run_diagnosis", memoized(tmp_path_factory.getbasetemp().parent / "kv-ranges-memo"))
    yield
    patch.undo()
