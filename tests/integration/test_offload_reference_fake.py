"""The offload reference (issue 39) through the real orchestration with the fake engine (KVEVAL_ENGINE=fake):
on a physical budget (`--gpu-memory-utilization`, no `--kv-cache-memory`) `auto` cannot hold one request of
the length while FP8 can. Without help the run ends INCONCLUSIVE and names the options; with
`--reference offload` an `auto` cell on the same share, with weights moved to host memory, is the baseline
and the run decides. The fake's pool is 1 GiB at gpu_memory_utilization 0.9, scaled by the share, plus the
offloaded GiB (worker/fake_engine.py): at 0.015 SmolLM2's 1,024-token request (23.6 MB in bf16) does not
fit, FP8's (11.8 MB) does."""
from __future__ import annotations

import pytest

import kveval
from kveval.errors import KvevalError
from tests.support.fake_engine_env import fake_engine_dir
from tests.support.quiet import Quiet

COUNTS = {"short_256": 2, "short_512": 0, "probe": 100, "ctx_1k": 0, "ctx_pct": 0, "over": 1}
ARGS = dict(kv=["fp8", "auto"], max_model_len=[1024], gpu_memory_utilization=0.015, suite="quick", tasks=["none"],
            counts=COUNTS, phases=("generation", "scoring"), diagnose=False, remedy="off", progress=Quiet())


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    yield from fake_engine_dir(tmp_path_factory, "offload-reference")


def test_without_help_the_run_names_the_options_that_give_a_baseline(fake, default_model_dir):
    run = kveval.compare(model=str(default_model_dir), out=fake / "plain", **ARGS)
    assert run.verdict.status == "INCONCLUSIVE"
    [reason] = [r for r in run.verdict.reasons if r.code == "no_baseline"]
    assert "--baseline-from" in reason.decide and "--reference offload" in reason.decide
    assert not (run.run_dir / "cells" / "auto-1024.reference.json").exists()


def test_with_the_offload_reference_the_capped_run_decides_on_its_own_card(fake, default_model_dir):
    run = kveval.compare(model=str(default_model_dir), out=fake / "offload", reference="offload", **ARGS)
    assert run.verdict.cells == {"fp8-1024": "PASS"}, [r.message for r in run.verdict.reasons]
    [entry] = run.manifest.quality_references.values()
    # 0.5 GiB asked (0.02 GiB lacking x 1.5 + 0.5), capped at SmolLM2's 0.25 GiB of weights (whole 0.25 GiB steps).
    assert entry.for_ == "auto-1024" and entry.cpu_offload_gb == 0.25 and entry.kv_cache_memory_bytes is None
    assert run.manifest.options.reference == "offload"
    review = (run.run_dir / "review.md").read_text(encoding="utf-8")
    assert "0.25 GiB of weights offloaded to host memory" in review
    # Quality only: the reference is no capacity figure.
    assert all(row.cell != "auto-1024.reference" for row in run.evidence.startup)


def test_offload_and_an_imported_baseline_are_refused_together(fake, default_model_dir):
    with pytest.raises(KvevalError, match="give one"):
        kveval.compare(model=str(default_model_dir), out=fake / "both", reference="offload",
                       baseline_from=fake / "plain", **ARGS)
