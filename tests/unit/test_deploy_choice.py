"""Issue 41: the deploy answer weighs capacity against its cost — the cost figures and their line, --prefer,
--slo (goodput), requests at once against max_num_seqs, what --search would add, bad values refused before any
engine starts, and published runs (single runs, no repeats) rendering it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.analysis.deploy_choice import choose, goodput
from kveval.analysis.deploy_cost import deployment_cost
from kveval.analysis.deploy_facts import concurrent_requests, search_note
from kveval.files import schema
from kveval.gate.verdict import Verdict
from kveval.inputs.slo import SloError, parse_slo
from kveval.render.headline import deployment

ROOT = Path(__file__).resolve().parents[2]


def _rows(model, rows):
    return [model.model_validate({**dict.fromkeys(model.model_fields), **row}) for row in rows]


def _throughput(kv, level, tok_s, ratio=None, low=None, high=None, ttft_p99=100.0, rps=1.0, seqs=None):
    return {"cell": f"{kv}-8192", "kv_spec": kv, "max_model_len": 8192, "concurrency": level, "requests": level,
            "output_tok_s": tok_s, "output_tok_s_vs_baseline": ratio, "vs_baseline_low": low, "vs_baseline_high": high,
            "vs_baseline_confidence": 0.97 if low is not None else None, "ttft_ms_p99": ttft_p99,
            "requests_per_s": rps, "max_num_seqs": seqs}


def _speed(kv, workload, tokens, ratio=None, delta=None):
    return {"workload": workload, "cell": f"{kv}-8192", "kv_spec": kv, "max_model_len": 8192, "prompt_tokens": tokens,
            "runs": 3, "ttft_ratio": ratio, "ttft_delta_pct": delta}


# Two passing configurations: fp8 holds 2× the pool but runs slower; fp8:keep=0 holds 1.9× and keeps pace.
THROUGHPUT = [_throughput("auto", 1, 100.0, rps=1.0, ttft_p99=50.0), _throughput("auto", 64, 1000.0, rps=4.0, ttft_p99=900.0),
              _throughput("fp8", 1, 90.0, 0.9, 0.85, 0.95, rps=0.9, ttft_p99=60.0),
              _throughput("fp8", 64, 600.0, 0.6, 0.55, 0.65, rps=2.4, ttft_p99=3000.0),
              _throughput("fp8:keep=0", 1, 99.0, 0.99, 0.95, 1.03, rps=1.0, ttft_p99=55.0),
              _throughput("fp8:keep=0", 64, 950.0, 0.95, 0.9, 1.0, rps=3.8, ttft_p99=1500.0)]
SPEED = [_speed("fp8", "short", 50, 1.5), _speed("fp8", "ctx_90pct", 7372, 2.77),
         _speed("fp8:keep=0", "ctx_90pct", 7372, delta=10.0)]


def _evidence(throughput=THROUGHPUT, speed=SPEED, startup=(), search=None) -> schema.Evidence:
    cells = {f"{kv}-8192": schema.EvidenceCell.model_construct(kv_spec=kv, max_model_len=8192, started=True,
                                                               attention_backend_flag=None)
             for kv in ("auto", "fp8", "fp8:keep=0")}
    pools = [schema.PoolRow.model_construct(kv_spec="fp8", max_model_len=8192, ratio=2.0, fallback_ratio=None),
             schema.PoolRow.model_construct(kv_spec="fp8:keep=0", max_model_len=8192, ratio=1.9, fallback_ratio=None)]
    return schema.Evidence.model_construct(
        cells=cells, pools=pools, throughput=_rows(schema.ThroughputRow, throughput), speed=_rows(schema.SpeedRow, speed),
        startup=_rows(schema.StartupRow, list(startup)), search=search, calibration=None, remedy=None)


VERDICT = Verdict(status="PASS", cells={"fp8-8192": "PASS", "fp8:keep=0-8192": "PASS"})


def test_cost_states_every_level_and_the_longest_prompts_ttft_with_intervals():
    cost = deployment_cost("fp8", 8192, _evidence())
    assert [(c.concurrency, c.ratio, c.low, c.high) for c in cost.throughput] == [(1, 0.9, 0.85, 0.95), (64, 0.6, 0.55, 0.65)]
    assert cost.line == ("Cost against `auto` at 8,192: output tok/s 0.90× (0.85–0.95) at 1, 0.60× (0.55–0.65) at 64 "
                         "concurrent; TTFT +177 % on the 7,372-token prompt (ctx_90pct) (intervals over the repeats, "
                         "95 % unless a coverage is given).")
    old = deployment_cost("fp8:keep=0", 8192, _evidence(throughput=[]))   # a run before repeats: Δ % only
    assert old.ttft[0].ratio == pytest.approx(1.1) and old.line.endswith("(single runs, no interval).")
    assert deployment_cost("fp8", 2048, _evidence()) is None


def test_the_default_keeps_todays_rule_and_a_preference_can_weigh_the_cost():
    evidence = _evidence()
    capacity = deployment(VERDICT, evidence)
    assert capacity.configuration == "fp8" and capacity.cost is not None and capacity.preference is None
    throughput = deployment(VERDICT, evidence, prefer="throughput")
    assert throughput.configuration == "fp8:keep=0" and throughput.notes[:1] == [
        "Chosen by --prefer throughput: output tok/s 0.97× `auto` (geometric mean over what was measured) against "
        "0.73× for `fp8`, which holds more KV."]
    latency = deployment(VERDICT, evidence, prefer="latency")
    assert latency.configuration == "fp8:keep=0" and latency.preference == "latency"
    # No figure for the preference: the capacity order.
    assert deployment(VERDICT, _evidence(throughput=[], speed=[]), prefer="throughput").configuration == "fp8"


def test_an_slo_picks_the_most_goodput_and_says_when_auto_has_more():
    targets = parse_slo(["ttft_p99=2s"])
    assert goodput("fp8", 8192, _evidence().throughput, targets).concurrency == 1    # 3 s at 64: misses
    chosen = deployment(VERDICT, _evidence(), slo=["ttft_p99=2s"])
    assert chosen.configuration == "fp8:keep=0" and chosen.slo == ["ttft_p99=2s"]
    assert [(g.configuration, g.concurrency, g.requests_per_s) for g in chosen.goodput] == \
        [("fp8", 1, 0.9), ("fp8:keep=0", 64, 3.8)]
    assert chosen.notes[0].startswith("Chosen for --slo ttft_p99=2s: 3.80 requests/s meet it at concurrency 64")
    assert "`auto` meets it with more goodput (4.00 requests/s" in chosen.notes[1]
    nobody = deployment(VERDICT, _evidence(), slo=["ttft_p50=10ms"])
    assert nobody.configuration == "fp8" and nobody.notes[0].startswith("No passing configuration meets --slo")


def test_choose_without_candidates_chooses_nothing():
    assert choose([], lambda kv: (0,), lambda kv: 8192, _evidence()).configuration is None


def test_requests_at_once_are_capped_by_max_num_seqs():
    startup = [{"cell": "fp8-8192", "kv_spec": "fp8", "max_model_len": 8192, "started": True, "max_concurrency": 600.0,
                "max_num_seqs": 256},
               {"cell": "auto-8192", "kv_spec": "auto", "max_model_len": 8192, "started": True,
                "max_concurrency": 300.0, "max_num_seqs": 256}]
    held, seqs, line = concurrent_requests("fp8", 8192, _evidence(startup=startup))
    assert (held, seqs) == (256, 256)
    assert line == ("Requests at once: the pool holds 600 requests of 8,192 tokens, but vLLM admits at most 256 "
                    "(max_num_seqs, as the cells ran), as many as `auto` (its pool holds 300): the extra KV buys no "
                    "concurrency at this length unless --max-num-seqs is raised.")
    answer = deployment(VERDICT, _evidence(startup=startup))
    assert answer.max_num_seqs == 256 and answer.concurrent_requests == 256 and answer.notes == [line]
    startup[1]["max_concurrency"] = 99.5
    assert concurrent_requests("fp8", 8192, _evidence(startup=startup))[2].endswith(
        "(max_num_seqs, as the cells ran); `auto`'s pool holds 99.5: raise --max-num-seqs to serve more.")
    assert concurrent_requests("fp8", 8192, _evidence()) == (None, None, None)   # before issue 41: not recorded


def test_search_is_named_where_a_remedy_was_deployed_without_it():
    assert search_note("fp8:keep=0", _evidence()).startswith("`--search` would add: calibrated K/V scales")
    assert search_note("fp8", _evidence()) is None
    assert search_note("fp8:keep=0", _evidence(search=object())) is None


@pytest.mark.parametrize("terms, message", [
    (["ttft=2"], None), (["ttft_p90=150ms", "tpot_p99=0.1s"], None),
    (["latency=2s"], "unknown metric 'latency'"), (["ttft_p95=2s"], "percentile p95"),
    (["ttft"], "expected METRIC"), (["ttft=2s", "ttft_p99=1s"], "same metric")])
def test_slo_terms(terms, message):
    if message is None:
        assert parse_slo(terms)
    else:
        with pytest.raises(SloError, match=message):
            parse_slo(terms)
    assert parse_slo(["TTFT=2"])[0].text == "ttft_p99=2ms" and parse_slo(["ttft=2s"])[0].seconds == 2.0


@pytest.mark.parametrize("arguments, words", [
    (["--prefer", "speed"], "Invalid value for '--prefer'"),
    (["--slo", "ttft_p95=2s"], "percentile p95 is not one kveval measures"),
    (["--repeat-target", "2"], "--repeat-target 2: give the relative half-width"),
    (["--repeat-budget", "-1"], "--repeat-budget -1"),
    (["--prefer", "latency", "--phases", "generation", "scoring"], "--prefer latency ranks configurations by the speed"),
    (["--slo", "ttft_p99=2s", "--phases", "generation", "speed"], "--slo is checked on the throughput phase's"),
])
def test_bad_values_are_one_line_before_any_engine(arguments, words, tmp_path):
    from kveval.cli.commands import cli

    outcome = CliRunner().invoke(cli, ["compare", "--kv", "fp8", "auto", "--out", str(tmp_path / "run"), *arguments])
    assert outcome.exit_code == 2 and words in outcome.output and "Traceback" not in outcome.output
    assert not (tmp_path / "run").exists()


def test_a_published_run_without_repeats_states_its_cost_and_what_search_adds(tmp_path):
    from kveval.cli.commands import cli

    run = tmp_path / "run"
    shutil.copytree(ROOT / "reports" / "h100-qwen2.5-coder-1.5b-8192", run)
    answer = json.loads(CliRunner().invoke(cli, ["gate", "--json", str(run)]).output)["deployment"]
    assert answer["configuration"] == "fp8:keep=0,1" and "max_num_seqs" not in answer
    assert answer["cost"]["line"] == ("Cost against `auto` at 8,192: output tok/s 0.76× at 1, 0.65× at 4, 0.57× at 16, "
                                      "0.64× at 64 concurrent; TTFT +172 % on the 7,372-token prompt (ctx_90pct) "
                                      "(single runs, no interval).")
    assert answer["notes"][0].startswith("`--search` would add")
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 4   # plain FP8 fails, the remedy passes (gate.verdict.EXIT_FOUND)
    review = (run / "review.md").read_text(encoding="utf-8")
    assert answer["line"] + "\\\n" + answer["cost"]["line"] + "\\\n" + answer["notes"][0] in review


def test_tables_do_not_promise_more_requests_than_max_num_seqs():
    from kveval.render.requests_at_once import capped, max_num_seqs_of

    startup = [{"cell": "fp8-8192", "kv_spec": "fp8", "max_model_len": 8192, "started": True, "max_concurrency": 600.0,
                "max_num_seqs": 256}]
    evidence = _evidence(startup=startup)
    assert max_num_seqs_of(evidence, "fp8-8192") == 256 and max_num_seqs_of(evidence, "auto-8192") is None
    assert capped(600.0, 256) == ", 256 at once (max_num_seqs)" and capped(3.5, 256) == "" and capped(600.0, None) == ""


def test_the_runs_own_choice_is_read_from_its_manifest_and_a_resume_may_change_it():
    from types import SimpleNamespace

    from kveval.render.headline import deployment_of
    from kveval.run.resume import _settings_fingerprint

    def manifest(**options):
        return SimpleNamespace(options=SimpleNamespace(enforce_eager=False, **options),
                               versions=SimpleNamespace(vllm="0.32.0"))

    assert deployment_of(VERDICT, _evidence(), manifest(prefer=None, slo=None)).configuration == "fp8"
    assert deployment_of(VERDICT, _evidence(), manifest(prefer="throughput", slo=None)).configuration == "fp8:keep=0"
    assert deployment_of(VERDICT, _evidence(), manifest(prefer=None, slo=["ttft_p99=2s"])).slo == ["ttft_p99=2s"]
    written = {"model": {}, "options": {"kv": ["fp8", "auto"], "prefer": "latency", "slo": ["ttft_p99=2s"]}}
    assert _settings_fingerprint(written)["options"] == {"kv": ["fp8", "auto"]}   # how to choose, not what to measure
