"""Issue 41: speed figures from repeats (the intervals, the stopping rule, the phases on the fake engine) and
the rows they give, with rows of runs before repeats unchanged."""
from __future__ import annotations

import math
import random

import pytest

from kveval.analysis.repeat_interval import median_interval, ratio_interval
from kveval.analysis.throughput import throughput_table
from kveval.files.cell_spec import SpeedOptions, ThroughputOptions
from kveval.worker.repeats import RepeatPlan
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells


# --- the intervals -------------------------------------------------------------------------------------------

def test_median_interval_is_the_order_statistic_pair_with_its_binomial_coverage():
    values = [float(v) for v in range(1, 11)]
    interval = median_interval(list(reversed(values)))
    # n = 10 at 95 %: x_(2), x_(9) (Conover's table), coverage 1 - 2·P(Binom(10, 1/2) <= 1) = 1 - 22/1024.
    assert (interval.estimate, interval.low, interval.high) == (5.5, 2.0, 9.0)
    assert interval.confidence == pytest.approx(1 - 22 / 1024)
    assert interval.relative_half_width == pytest.approx(3.5 / 5.5)


def test_few_repeats_give_min_max_with_the_coverage_they_really_have():
    three = median_interval([3.0, 1.0, 2.0])
    assert (three.low, three.high, three.confidence) == (1.0, 3.0, pytest.approx(0.75))
    assert not three.tight(10.0)              # wide enough, but not 95 %: not tight
    one = median_interval([4.0, None])
    assert (one.estimate, one.low, one.high, one.n) == (4.0, None, None, 1)
    assert median_interval([]).estimate is None
    six_equal = median_interval([2.0] * 6)
    assert six_equal.confidence >= 0.95 and six_equal.tight(0.05)


def test_ratio_is_hodges_lehmann_with_the_mann_whitney_interval():
    base = [1.0, 1.1, 0.9, 1.05]
    ratio = ratio_interval([2 * v for v in base], base)
    assert ratio.estimate == pytest.approx(2.0)
    # m = n = 4: the extreme pairwise ratios, coverage 1 - 2/C(8, 4).
    assert ratio.low == pytest.approx(2 * 0.9 / 1.1) and ratio.high == pytest.approx(2 * 1.1 / 0.9)
    assert ratio.confidence == pytest.approx(1 - 2 / 70)
    single = ratio_interval([3.0], [2.0])
    assert single.estimate == pytest.approx(1.5) and single.low is None


def test_ratio_interval_covers_the_true_ratio_at_least_95_percent_of_the_time():
    rng = random.Random(41)
    covered, trials = 0, 300
    for _ in range(trials):
        tested = [0.7 * math.exp(rng.gauss(0, 0.2)) for _ in range(8)]
        baseline = [math.exp(rng.gauss(0, 0.2)) for _ in range(8)]
        interval = ratio_interval(tested, baseline)
        covered += interval.low <= 0.7 <= interval.high
    assert covered / trials >= 0.93      # nominal >= 0.95; 300 trials leave about 1.3 points of noise


# --- the stopping rule ---------------------------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_repeats_stop_when_tight_at_the_maximum_or_when_the_items_share_of_time_is_spent():
    clock = _Clock()
    plan = RepeatPlan(guaranteed=1, minimum=3, maximum=8, target=0.05, budget_s=100.0, items=2, clock=clock)
    assert plan.more(0, [[]])
    assert plan.more(0, [[1.0, 1.0]])                       # under the minimum
    assert plan.more(0, [[1.0, 1.0, 1.0]])                  # 3 runs: 75 % coverage, not tight yet
    assert not plan.more(0, [[1.0] * 6])                    # 6 equal runs: tight at 95 %
    assert plan.more(0, [[1.0, 2.0, 1.0, 2.0, 1.0, 2.0]])   # wide
    assert not plan.more(0, [[1.0, 2.0] * 4])               # the maximum
    clock.now = 50.0                                        # item 0's half of the time is spent
    assert not plan.more(0, [[1.0, 2.0]]) and plan.more(1, [[1.0, 2.0]])
    clock.now = 100.0
    assert plan.more(1, [[]]) and not plan.more(1, [[1.0]])  # the first run is never skipped


def test_guaranteed_runs_are_taken_whatever_the_time():
    plan = RepeatPlan(guaranteed=3, minimum=3, maximum=3, target=0.05, budget_s=0.0, items=1)
    assert plan.more(0, [[1.0, 1.0]]) and not plan.more(0, [[1.0, 1.0, 1.0]])


# --- the phases on the fake engine ---------------------------------------------------------------------------

def _fake_engine(max_num_seqs: int | None = None):
    from kveval.worker.fake_engine import Damage, Engine, EngineSettings, _Config

    settings = EngineSettings(model="m", kv_cache_dtype="auto", max_model_len=1024, seed=0,
                              extra={"max_num_seqs": max_num_seqs} if max_num_seqs else {})
    config = _Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, hidden_size=32,
                     max_position_embeddings=2048)
    return Engine(settings, config, Damage())


def _context(engine, throughput: ThroughputOptions | None = None, speed: SpeedOptions | None = None):
    from kveval.files import schema
    from kveval.files.cell_spec import PhaseOptions, ScoringOptions, TasksOptions
    from kveval.inputs.workloads import PromptSpec
    from kveval.worker.phases.context import CellContext

    options = PhaseOptions(scoring=ScoringOptions(top_k=5, noise=False),
                           speed=speed or SpeedOptions(runs=2, warmup=1, workloads=None, max_tokens=8),
                           tasks=TasksOptions(tasks=[], limit=None),
                           throughput=throughput or ThroughputOptions(levels=[1, 4], prompt_share=0.25, max_tokens=8))
    prompts = [PromptSpec(id="ctx-0", workload="ctx", kind="ctx", text="x", token_ids=tuple(range(300)),
                          max_tokens=8, target_tokens=None)]
    return CellContext(cell_id="auto-1024", kv_spec="auto", max_model_len=1024, prompts=prompts, options=options,
                       capacity=schema.Capacity.model_validate(engine.capacity()))


def test_throughput_repeats_each_level_and_stays_under_max_num_seqs():
    from kveval.files import schema
    from kveval.worker.phases import throughput

    engine = _fake_engine(max_num_seqs=6)
    options = ThroughputOptions(levels=[1, 4, 16], prompt_share=0.25, max_tokens=8, repeats=3, repeat_max=5,
                                repeat_target=0.05, repeat_budget_s=600.0)
    phase = throughput.run(engine, _context(engine, throughput=options))
    assert phase.max_num_seqs == 6 and phase.levels == [1, 4, 6]   # 16 and the pool's own maximum: above it
    # The fake's timings never vary: 5 equal runs are still under 95 % coverage, so each level runs its maximum.
    assert [(r.concurrency, r.repeat) for r in phase.runs] == [(c, k) for c in (1, 4, 6) for k in range(5)]
    schema.ThroughputPhase.model_validate(schema.dump(phase))   # stored as the cell file reads it back


def test_throughput_without_repeat_time_runs_each_level_once_as_before():
    from kveval.worker.phases import throughput

    engine = _fake_engine()
    old_spec = ThroughputOptions(levels=[1, 4], prompt_share=0.25, max_tokens=8)   # a spec file from before
    phase = throughput.run(engine, _context(engine, throughput=old_spec))
    assert [r.concurrency for r in phase.runs] == [1, 4, 256]


def test_speed_keeps_its_runs_then_repeats_until_tight():
    from kveval.files import schema
    from kveval.worker.phases import speed

    engine = _fake_engine()
    options = SpeedOptions(runs=2, warmup=1, workloads=None, max_tokens=8, repeat_max=7, repeat_target=0.05,
                           repeat_budget_s=600.0)
    phase = speed.run(engine, _context(engine, speed=options))
    assert len(phase.workloads[0].runs) == 6     # equal timings: tight at 6 (95 % needs 6 runs)
    old = speed.run(engine, _context(engine, speed=SpeedOptions(runs=2, warmup=1, workloads=None, max_tokens=8)))
    assert len(old.workloads[0].runs) == 2 and "repeat_max" in schema.dump(old)


# --- the rows ------------------------------------------------------------------------------------------------

def _run(level, wall, repeat=None, tokens=16):
    run = {"concurrency": level, "accepted": True, "error": None, "wall_seconds": wall,
           "requests": [{"output_tokens": tokens, "ttft_s": 0.1, "itl_s": 0.01} for _ in range(level)]}
    return run if repeat is None else {**run, "repeat": repeat}


def _cell(kv, runs, **phase):
    return complete_cell({"cell": f"{kv}-1024", "kv_spec": kv, "max_model_len": 1024, "started": True,
                          "phases": {"throughput": {"prompt_tokens": 256, "max_tokens": 16, "levels": [4],
                                                    "max_concurrency": 8.0, "runs": runs, **phase}}})


def test_a_repeated_level_is_one_row_with_medians_and_the_ratios_interval():
    auto = [_run(4, w, k) for k, w in enumerate([4.0, 4.2, 3.8, 4.1, 3.9, 4.0])]
    fp8 = [_run(4, w, k) for k, w in enumerate([8.0, 8.4, 7.6, 8.2, 7.8, 8.0])]
    table = throughput_table(typed_cells({"auto-1024": _cell("auto", auto, max_num_seqs=256),
                              "fp8-1024": _cell("fp8", fp8, max_num_seqs=256)}))
    row = table.set_index("cell").loc["fp8-1024"]
    assert row.repeats == 6 and row.output_tok_s == pytest.approx(64 / 8.0) and row.max_num_seqs == 256
    assert row.output_tok_s_low < row.output_tok_s < row.output_tok_s_high
    assert row.output_tok_s_vs_baseline == pytest.approx(0.5, rel=0.02)
    assert row.vs_baseline_low < 0.5 < row.vs_baseline_high < 1.0 and row.vs_baseline_confidence >= 0.95


def test_rows_of_runs_without_repeats_keep_their_keys():
    table = throughput_table(typed_cells({"auto-1024": _cell("auto", [_run(4, 4.0)]), "fp8-1024": _cell("fp8", [_run(4, 2.0)])}))
    assert "repeats" not in table and "vs_baseline_low" not in table
    assert table.set_index("cell").loc["fp8-1024"].output_tok_s_vs_baseline == 2.0


def _speed_cell(kv, ttfts, repeat_max=10):
    runs = [{"ttft_s": t, "decode_tok_s": 100.0 / t, "output_tokens": 8} for t in ttfts]
    phase = {"concurrency": 1, "warmup_runs": 1, "measured_runs": 3, "repeat_max": repeat_max,
             "workloads": [{"workload": "ctx", "prompt_tokens": 300, "max_tokens": 8, "runs": runs,
                            "ttft_s": {"median": sorted(ttfts)[len(ttfts) // 2], "min": min(ttfts), "max": max(ttfts),
                                       "n": len(ttfts)}}]}
    if repeat_max is None:
        del phase["repeat_max"]
    return complete_cell({"cell": f"{kv}-1024", "kv_spec": kv, "max_model_len": 1024, "started": True,
                          "phases": {"speed": phase}})


def test_speed_rows_carry_the_ttft_ratio_and_its_interval_only_for_repeated_runs():
    from kveval.analysis.speed import speed_table

    auto = [0.10, 0.11, 0.09, 0.10, 0.105, 0.095]
    table = speed_table(typed_cells({"auto-1024": _speed_cell("auto", auto), "fp8-1024": _speed_cell("fp8", [3 * t for t in auto])}))
    row = table.set_index("cell").loc["fp8-1024"]
    assert row.ttft_ratio == pytest.approx(3.0) and row.ttft_ratio_low < 3.0 < row.ttft_ratio_high
    assert row.decode_ratio == pytest.approx(1 / 3) and row.ttft_ratio_confidence >= 0.95
    assert row.ttft_ms_low <= row.ttft_ms <= row.ttft_ms_high and "repeat_ttft_s" not in table
    old = speed_table(typed_cells({"auto-1024": _speed_cell("auto", auto, None), "fp8-1024": _speed_cell("fp8", auto, None)}))
    assert "ttft_ratio" not in old and "ttft_ms_low" not in old


def test_the_review_shows_repeats_and_intervals_and_max_num_seqs():
    from tests.support.constructed import manifest_for
    from tests.support.review import review_of

    auto = [_run(4, w, k) for k, w in enumerate([4.0, 4.2, 3.8, 4.1, 3.9, 4.0])]
    fp8 = [_run(4, w / 2, k) for k, w in enumerate([4.0, 4.2, 3.8, 4.1, 3.9, 4.0])]
    cells = {"auto-1024": _cell("auto", auto, max_num_seqs=4), "fp8-1024": _cell("fp8", fp8, max_num_seqs=4)}
    review = review_of(manifest_for(cells), [], cells)
    assert "Each level ran until the 95 % interval of its median output tok/s" in review
    assert "× auto 95 % CI" in review and "| 1.90–2.10×" in review
    assert "| 2.00× (1.90–2.10) at 4 concurrent |" in review      # the decision table's throughput column
    assert ("- **fp8-1024**: ahead of `auto` at concurrency 4 (its pool holds 8.0 requests of max_model_len; "
            "vLLM admits 4 at once (max_num_seqs)).") in review


def test_with_repeats_the_ratios_interval_says_whether_a_speed_change_is_beyond_noise():
    from kveval.analysis.speed import speed_table

    auto = [0.10, 0.11, 0.09, 0.10, 0.105, 0.095]
    table = speed_table(typed_cells({"auto-1024": _speed_cell("auto", auto), "fp8-1024": _speed_cell("fp8", [1.5 * t for t in auto]),
                         "fp8:keep=0-1024": _speed_cell("fp8:keep=0", [1.01 * t for t in auto])})).set_index("cell")
    assert table.loc["fp8-1024"].ttft_vs_noise == "beyond" and table.loc["fp8:keep=0-1024"].ttft_vs_noise == "within"
    few = speed_table(typed_cells({"auto-1024": _speed_cell("auto", auto[:2]), "fp8-1024": _speed_cell("fp8", auto[:2])}))
    assert few.set_index("cell").loc["fp8-1024"].ttft_vs_noise == "too few runs"    # 2 a side: 67 % coverage


def test_a_level_whose_ratio_interval_is_short_of_95_percent_is_not_called_ahead_or_behind():
    from kveval.analysis.throughput import throughput_findings
    from kveval.files import schema

    auto = [_run(1, w, k) for k, w in enumerate([4.0, 4.1, 3.9])] + [_run(4, w, k) for k, w in enumerate([4.0] * 6)]
    fp8 = [_run(1, 40.0, 0)] + [_run(4, w, k) for k, w in enumerate([8.0, 8.1, 7.9, 8.2, 7.8, 8.0])]
    table = throughput_table(typed_cells({"auto-1024": _cell("auto", auto), "fp8-1024": _cell("fp8", fp8)}))
    rows = [schema.ThroughputRow.model_validate({k: (None if v != v else v) for k, v in row.items()})
            for row in table.to_dict("records")]
    finding = throughput_findings(rows)[0]
    # Level 1: one fp8 run against 3 (75 % coverage) at 0.1×: too few runs, not "behind" by the old ±10 % rule.
    assert (finding.ahead, finding.behind, finding.too_few) == ([], [4], [1]) and finding.by_interval


def test_a_cell_process_imports_no_scipy():
    # Every cell process imports the repeats' intervals: scipy.stats would add ~1 s to each on the 2-core CPU,
    # and at import it inspects whatever module is named `torch` (a fork server with tests/support/bad_fork's
    # stand-in died of it before its probe fork, so it never said "unsafe").
    import subprocess
    import sys
    code = ("import sys, kveval.worker.cell_main, kveval.worker.phases, kveval.worker.fake_engine; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
