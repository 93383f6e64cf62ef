"""The deploy line's --max-model-len (issue 41): capped at the longest length up to which every tested length
passed, so the pasted line never serves a length that failed or was not decided."""
from __future__ import annotations

import pytest

from kveval.gate import FAIL, INCONCLUSIVE, NOT_STARTED, PASS
from kveval.render.headline import longest_passing


@pytest.mark.parametrize("statuses,cap", [
    ({PASS: [2048, 8192, 32768]}, 32768),
    ({PASS: [2048], FAIL: [8192]}, 2048),
    ({PASS: [2048, 32768], FAIL: [8192]}, 2048),            # a pass above a failure is not safe to serve
    ({PASS: [8192], INCONCLUSIVE: [2048]}, None),           # the shortest length is undecided: nothing to cap at
    ({PASS: [2048, 8192], NOT_STARTED: [32768]}, 8192),
])
def test_the_cap_is_the_top_of_the_passing_prefix(statuses, cap):
    assert longest_passing(statuses) == cap


def test_gate_json_and_results_carry_the_reviews_deployment(tmp_path):
    # The published H100 Qwen2.5 run: plain FP8 fails, layers 0, 1 kept pass at 8192 on Triton (issue 41).
    import json
    import shutil
    from pathlib import Path

    from click.testing import CliRunner

    from kveval.cli.commands import cli

    source = Path(__file__).resolve().parents[2] / "reports" / "h100-qwen2.5-coder-1.5b-8192"
    run = tmp_path / "run"
    shutil.copytree(source, run)
    outcome = CliRunner().invoke(cli, ["gate", "--json", str(run)])
    assert outcome.exit_code == 4, outcome.output   # plain FP8 fails, the remedy passes (issue 41's EXIT_FOUND)
    deployment = json.loads(outcome.output)["deployment"]
    assert deployment["configuration"] == "fp8:keep=0,1" and deployment["max_model_len"] == 8192
    assert deployment["vllm_serve"] == ("vllm serve MODEL --kv-cache-dtype fp8 --kv-cache-dtype-skip-layers 0 1 "
                                        "--max-model-len 8192 --attention-backend TRITON_ATTN")
    assert deployment["vllm_version"] == "0.26.0" and deployment["pool_ratio"] == pytest.approx(838_848 / 449_376)
    assert deployment["line"] in (source / "review.md").read_text(encoding="utf-8")
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == 4
    from kveval.files.rundir import RunDir, read_json

    assert read_json(RunDir(run).results_path)["deployment"] == deployment
