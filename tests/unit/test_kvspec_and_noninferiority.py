"""KV specs (fp8:keep=...), the paired recovery bound, and the per-cell settings kveval owns."""
from __future__ import annotations

import pytest

from kveval.analysis.noninferiority import paired_recovery_bound, samples_to_decide, score_statistic
from kveval.cli.options import split_values
from kveval.inputs.kvspec import KVSpec, KVSpecError, parse_kv


def test_keep_spec_parses_sorts_and_names_itself():
    spec = parse_kv("fp8:keep=17,3")
    assert spec == KVSpec("fp8", ("3", "17"))
    assert spec.text == "fp8:keep=3,17"
    assert spec.engine_settings() == {"kv_cache_dtype": "fp8", "kv_cache_dtype_skip_layers": ["3", "17"]}
    assert spec.label("bf16") == "FP8 with layers 3, 17 kept in bf16"
    assert parse_kv("fp8:keep=0").label("bf16") == "FP8 with layer 0 kept in bf16"
    assert parse_kv("fp8").engine_settings() == {"kv_cache_dtype": "fp8"}


@pytest.mark.parametrize("text,message", [
    ("fp 8", "not a KV-cache dtype name"), ("fp8:skip=1", "knows keep=LAYERS and scaled"), ("fp8:keep=", "at least one"),
    ("fp8:scaled=row", "scaled= takes tensor or head"), ("auto:scaled", "auto is the baseline"),
    ("fp8_e5m2:scaled", "e4m3"),
    ("fp8:keep=x1", "not a layer index"), ("fp8:keep=x", "attention type vLLM knows"),
    ("auto:keep=0", "auto is the baseline"),
])
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(KVSpecError, match=message):
        parse_kv(text)


def test_comma_lists_keep_a_keep_list_together():
    assert split_values(["fp8:keep=0,1,auto"]) == ("fp8:keep=0,1", "auto")
    assert split_values(["fp8,auto"]) == ("fp8", "auto")
    assert split_values(["fp8:scaled,keep=0,1,auto", "fp8:keep=2,scaled=head"]) == (
        "fp8:scaled,keep=0,1", "auto", "fp8:keep=2,scaled=head")


def test_scaled_specs_parse_in_any_order_and_name_one_configuration():
    spec = parse_kv("FP8:keep=17,3,Scaled=HEAD")
    assert spec == KVSpec("fp8", ("3", "17"), "head")
    assert spec.text == "fp8:scaled=head,keep=3,17" and parse_kv(spec.text) == spec
    assert parse_kv("fp8:scaled") == KVSpec("fp8", (), "tensor") and parse_kv("fp8:scaled=tensor").text == "fp8:scaled"
    assert parse_kv("fp8:scaled").label("bf16") == "FP8 with calibrated per-tensor scales"
    assert spec.label("bf16") == "FP8 with calibrated per-head scales, layers 3, 17 kept in bf16"


def test_recovery_bound_matches_the_h200_healthy_pairing():
    # reports/archive/h200-tasks fp8-2048: 127 -> 123 of 270; the bound clears the 0.90 margin.
    bound = paired_recovery_bound(270, 10, 6, 127 / 270)
    assert 0.90 < bound < 0.97


def test_recovery_bound_of_twelve_samples_is_wide():
    assert paired_recovery_bound(12, 1, 1, 0.5) < 0.7


def test_bound_with_no_discordant_pair_is_still_below_one():
    assert paired_recovery_bound(100, 0, 0, 0.5) < 1.0
    assert paired_recovery_bound(16, 0, 0, 1.0) < 0.9  # a small perfect pairing is no proof


def test_samples_to_decide():
    need = samples_to_decide(12, 1, 1, 0.5, 0.90)
    assert need is not None and need > 12
    scale = need / 12  # the same shares at that size reach the margin
    assert paired_recovery_bound(need, round(scale), round(scale), 0.5) >= 0.895
    assert samples_to_decide(54, 6, 2, 0.5, 0.90) is None  # observed recovery under the margin


def test_bound_matches_tangs_score_interval():
    # Closed forms of Tang, Tang & Chan (2003): no discordant pair gives n11 / (n11 + z^2).
    z = 1.6448536269514722
    assert paired_recovery_bound(120, 0, 0, 0.5) == pytest.approx(60 / (60 + z * z), abs=1e-6)
    # At the bound the score statistic equals z; above it, it is smaller.
    bound = paired_recovery_bound(156, 8, 5, 0.5)
    assert score_statistic(bound, 70, 5, 8, 156) == pytest.approx(z, abs=1e-6)
    assert score_statistic(bound + 0.01, 70, 5, 8, 156) < z
    assert 0 <= paired_recovery_bound(12, 3, 0, 0.5, 0.0017) < 0.5   # never negative, even at a tiny alpha


def test_bound_refuses_a_zero_baseline():
    with pytest.raises(ValueError):
        paired_recovery_bound(10, 0, 0, 0.0)


def test_sliding_window_is_a_keep_name():
    assert parse_kv("fp8:keep=sliding_window,0").keep == ("0", "sliding_window")


def test_two_spellings_of_one_vllm_cache_run_once():
    # vLLM reads "fp8" as e4m3 everywhere: --kv fp8 fp8_e4m3 is one configuration, run once under the first
    # spelling, and the run says which spelling went; e5m2 is another cache and stays.
    from kveval.run.options import CompareOptions, normalized

    options = normalized(CompareOptions(kv=("fp8_e4m3", "FP8", "fp8_e5m2", "fp8:keep=0", "fp8_e4m3:keep=0", "auto")))
    assert options.kv == ("fp8_e4m3", "fp8_e5m2", "fp8:keep=0", "auto")
    assert options.merged_kv == (("fp8", "fp8_e4m3"), ("fp8_e4m3:keep=0", "fp8:keep=0"))
    assert parse_kv("fp8_e4m3:scaled").cache == parse_kv("fp8:scaled")
    assert parse_kv("fp8_e5m2").cache != parse_kv("fp8").cache


def test_search_keeps_its_plain_fp8_start_when_the_user_spelled_it_e4m3():
    from kveval.run.options import CompareOptions, normalized

    options = normalized(CompareOptions(kv=("fp8_e4m3", "auto"), search=True))
    assert options.kv == ("fp8", "auto") and options.merged_kv == (("fp8_e4m3", "fp8"),)
