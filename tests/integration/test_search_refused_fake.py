"""`kveval compare --search` past candidates that fail or that the engine refuses (issue 20), on the fake
engine and the fake calibration (KVEVAL_ENGINE=fake); its own module so that it runs beside
test_search_fake.py's run on another pytest-xdist worker."""
from __future__ import annotations

import pytest

from kveval.gate import NOT_STARTED, PASS
from tests.integration.test_search_fake import planted_model, search_run

HEAD_REFUSED = "per-head KV cache scales are only supported on the FLASH_ATTN backend"


def test_refused_and_failing_candidates_are_passed_over_in_order(tmp_path_factory, default_model_dir):
    """Scales do not heal this damage, and the engine refuses per-head scales: the search runs fp8,
    fp8:scaled, skips fp8:scaled=head with vLLM's words, then keeps the worst layer, then both."""
    planted = planted_model(tmp_path_factory, default_model_dir)
    patch = pytest.MonkeyPatch()
    try:
        damage = {"fp8_noise": 0.15, "layers": {"3": 0.6, "17": 0.6}, "head_scales_refused": HEAD_REFUSED}
        run = search_run(tmp_path_factory.mktemp("refused"), planted, damage, patch)
    finally:
        patch.undo()
    length = run.evidence.search.lengths[0]
    assert length.tried[:3] == ["fp8", "fp8:scaled", "fp8:scaled=head"]
    assert length.tried[3] in ("fp8:keep=3", "fp8:keep=17") and length.tried[4:] == ["fp8:keep=3,17"]
    assert length.chosen == "fp8:keep=3,17"
    assert run.verdict.cells["fp8:scaled=head-1024"] == NOT_STARTED
    # Skipped with vLLM's own words, and the search went on.
    assert any("fp8:scaled=head" in note and HEAD_REFUSED in note for note in length.notes), length.notes
    assert run.verdict.cells["fp8:keep=3,17-1024"] == PASS
    review = (run.run_dir / "review.md").read_text()
    assert "--kv-cache-dtype-skip-layers 3 17 --max-model-len " in review
