"""The run's two answers and its exit code (issue 41): the asked configurations' verdict, whether any tested
FP8 configuration is deployable, and the code CI gates on (0 as asked, 4 a configuration kveval tested
passes, 1 nothing deployable, 3 undecided; `gate --require any` makes 4 a 0). On the published H100 runs
(PASS, plain FAIL with a passing remedy, INCONCLUSIVE) and on constructed verdicts for the rules."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kveval.api import EXIT_FOUND, KvevalError, checked_require, judge_decision, run_exit_code
from kveval.cli.commands import cli
from kveval.files import schema
from kveval.files.rundir import RunDir, read_json
from kveval.gate import EXIT_FAIL, EXIT_INCONCLUSIVE, EXIT_PASS, EXIT_USAGE, FAIL, INCONCLUSIVE, NOT_STARTED, PASS
from kveval.gate.decision import asked_status, deployable_status, exit_code_of
from kveval.gate.verdict import Reason, Verdict

REPORTS = Path(__file__).resolve().parents[2] / "reports"
SMOLLM2 = REPORTS / "h100-smollm2-8192"                # fp8 PASS at 8192
QWEN = REPORTS / "h100-qwen2.5-coder-1.5b-8192"        # fp8 FAIL, fp8:keep=0,1 PASS at 8192
GEMMA = REPORTS / "h100-gemma3-270m-8192"              # fp8 INCONCLUSIVE at 8192


@pytest.fixture(autouse=True)
def no_figures(monkeypatch):
    monkeypatch.setenv("KVEVAL_NO_PLOTS", "1")   # review, results.json and codes are read here, no figure


def _copy(source: Path, tmp_path: Path) -> Path:
    run = tmp_path / source.name
    shutil.copytree(source, run)
    return run


def _gate(run: Path, *args: str):
    return CliRunner().invoke(cli, ["gate", *args, str(run)])


# --- the published runs -----------------------------------------------------------------------------

@pytest.mark.parametrize("source,code,any_code,asked,deployable,configuration", [
    (SMOLLM2, EXIT_PASS, EXIT_PASS, PASS, PASS, "fp8"),
    (QWEN, EXIT_FOUND, EXIT_PASS, FAIL, PASS, "fp8:keep=0,1"),
    (GEMMA, EXIT_INCONCLUSIVE, EXIT_INCONCLUSIVE, INCONCLUSIVE, INCONCLUSIVE, None),
])
def test_report_gate_and_results_agree_on_the_code(source, code, any_code, asked, deployable, configuration, tmp_path):
    run = _copy(source, tmp_path)
    # `report` exits through the same path as `compare` (cli/commands._finish): the run's code
    assert CliRunner().invoke(cli, ["report", str(run)]).exit_code == code
    results = read_json(RunDir(run).results_path)
    decision = schema.Decision.model_validate(results["decision"])
    assert (decision.asked, decision.deployable, decision.configuration) == (asked, deployable, configuration)
    assert decision.asked_configurations == ["fp8"]
    assert results["verdict"]["exit_code"] == decision.exit_code == code
    assert decision.exit_code_require_any == any_code
    assert _gate(run).exit_code == code
    assert _gate(run, "--require", "plain").exit_code == code
    assert _gate(run, "--require", "any").exit_code == any_code
    verdict, deployment, judged = judge_decision(run)
    assert judged == decision and deployment.configuration == configuration
    assert run_exit_code(judged) == code and run_exit_code(judged, "any") == any_code


def test_plain_fail_with_a_passing_remedy_exits_4_and_says_both_verdicts(tmp_path):
    run = _copy(QWEN, tmp_path)
    result = _gate(run)
    assert result.exit_code == EXIT_FOUND == 4, result.output
    lines = result.output.splitlines()
    assert lines[:2] == ["FAIL", "- FAIL (fp8 as asked); deployable FP8 configuration: PASS "
                                 "(fp8:keep=0,1 up to --max-model-len 8192)"]
    assert "exit code 4 (--require plain)" in lines
    review = (run / "review.md").read_text(encoding="utf-8").splitlines()
    assert review[2] == "## Verdict: **FAIL** (`fp8` as asked)"
    assert review[4].startswith("Deployable FP8 configuration: **PASS** (`fp8:keep=0,1` up to --max-model-len 8192) "
                                "· exit code 4: ")
    # the deploy line is still the one the review had: only the verdict lines are new
    assert any(line.startswith("Deploy (passes at 8192; verified on vLLM 0.26.0): `vllm serve MODEL --kv-cache-dtype "
                               "fp8 --kv-cache-dtype-skip-layers 0 1 --max-model-len 8192") for line in review)
    reported = CliRunner().invoke(cli, ["report", str(run)])
    assert reported.exit_code == 4
    assert "Verdict: FAIL (fp8 as asked); deployable FP8 configuration: PASS" in reported.stderr
    assert reported.stderr.rstrip().endswith("exit code 4")


def test_gate_json_require_any_turns_4_into_0_and_keeps_the_decision(tmp_path):
    run = _copy(QWEN, tmp_path)
    results_before = RunDir(run).results_path.read_bytes()
    plain = _gate(run, "--json")
    assert plain.exit_code == 4
    document = json.loads(plain.output)
    assert (document["verdict"], document["exit_code"], document["require"]) == ("FAIL", 4, "plain")
    assert document["decision"]["exit_code"] == 4 and document["decision"]["exit_code_require_any"] == 0
    assert document["decision"]["configuration"] == document["deployment"]["configuration"] == "fp8:keep=0,1"
    assert document["decision"]["max_model_len"] == document["deployment"]["max_model_len"] == 8192
    relaxed = _gate(run, "--json", "--require", "any")
    assert relaxed.exit_code == 0
    document = json.loads(relaxed.output)
    assert (document["exit_code"], document["require"], document["decision"]["exit_code"]) == (0, "any", 4)
    assert RunDir(run).results_path.read_bytes() == results_before   # --json writes nothing


def test_a_bad_require_is_one_line_exit_2_and_writes_nothing(tmp_path):
    run = _copy(QWEN, tmp_path)
    review = (run / "review.md").read_text(encoding="utf-8")
    for args in (["--require", "foo"], ["--json", "--require", "everything"]):
        result = _gate(run, *args)
        assert result.exit_code == EXIT_USAGE, result.output
        assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
        assert result.output.startswith("Error: --require ") and "give plain" in result.output
    assert (run / "review.md").read_text(encoding="utf-8") == review
    assert checked_require(" ANY ") == "any"
    with pytest.raises(KvevalError, match="--require 'foo'"):
        checked_require("foo")


def test_help_and_readme_name_every_code():
    gate_help = " ".join(CliRunner().invoke(cli, ["gate", "--help"]).output.split())
    assert "--require plain|any" in gate_help and "4 what was asked does not pass" in gate_help
    compare_help = " ".join(CliRunner().invoke(cli, ["compare", "--help"]).output.split())
    assert "4 when they do not but a configuration kveval tested passes" in compare_help
    readme = (REPORTS.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Exit codes"):]
    section = section[:section.index("\n## ", 5)]
    for row in ("| 0 |", "| 1 |", "| 2 |", "| 3 |", "| 4 |", "| 5 |", "| 70 |", "| 130 |"):
        assert row in section
    assert "--require any" in section


# --- the rules, on constructed verdicts --------------------------------------------------------------

def _deployment(configuration: str | None = None, passes_at: list[int] | None = None,
                cap: int | None = None) -> schema.Deployment:
    return schema.Deployment(line="Deploy: ...", configuration=configuration, vllm_serve="vllm serve MODEL ...",
                             max_model_len=cap, passes_at=passes_at or [], pool_ratio=None, vllm_version=None,
                             attention_backend=None, enforce_eager=False)


def _codes(by_spec: dict[str, dict[int, str]], deployment: schema.Deployment, asked=("fp8",),
           reasons: list[Reason] | None = None) -> tuple[str, str, int, int]:
    verdict = Verdict(FAIL, reasons=reasons or [])
    plain, deployable = asked_status(verdict, by_spec, list(asked)), deployable_status(verdict, by_spec, deployment)
    return plain, deployable, exit_code_of(plain, deployable), exit_code_of(plain, deployable, "any")


def test_plain_fail_and_an_undecided_remedy_is_undecided_not_fail():
    by_spec = {"fp8": {8192: FAIL}, "fp8:keep=0,1": {8192: INCONCLUSIVE}}
    assert _codes(by_spec, _deployment()) == (FAIL, INCONCLUSIVE, EXIT_INCONCLUSIVE, EXIT_INCONCLUSIVE)


def test_nothing_deployable_is_fail():
    by_spec = {"fp8": {8192: FAIL}, "fp8:keep=0,1": {8192: FAIL}, "fp8:keep=0": {8192: NOT_STARTED}}
    assert _codes(by_spec, _deployment()) == (FAIL, FAIL, EXIT_FAIL, EXIT_FAIL)


def test_a_pass_capped_at_a_shorter_length_is_4_and_any_accepts_the_cap():
    # fp8 passes at 2048 and fails at 8192: the deploy line serves fp8 with --max-model-len 2048
    by_spec = {"fp8": {2048: PASS, 8192: FAIL}}
    assert _codes(by_spec, _deployment("fp8", [2048], 2048)) == (FAIL, PASS, EXIT_FOUND, EXIT_PASS)
    # undecided at 8192 instead: the same answer, plain FP8 being undecided rather than failed
    by_spec = {"fp8": {2048: PASS, 8192: INCONCLUSIVE}}
    assert _codes(by_spec, _deployment("fp8", [2048], 2048)) == (INCONCLUSIVE, PASS, EXIT_FOUND, EXIT_PASS)


def test_a_failing_remedy_does_not_spoil_a_passing_asked_configuration():
    # --remedy always: plain FP8 passes, its remedy fails; the run's overall status is FAIL, the code 0
    by_spec = {"fp8": {8192: PASS}, "fp8:keep=0": {8192: FAIL}}
    assert _codes(by_spec, _deployment("fp8", [8192], 8192)) == (PASS, PASS, EXIT_PASS, EXIT_PASS)


def test_a_run_level_doubt_keeps_the_asked_verdict_undecided():
    no_baseline = Reason(INCONCLUSIVE, None, "no auto baseline cell started", code="no_baseline")
    assert _codes({"fp8": {8192: PASS}}, _deployment(), reasons=[no_baseline])[:3] == \
        (INCONCLUSIVE, INCONCLUSIVE, EXIT_INCONCLUSIVE)


def test_an_unknown_require_is_refused():
    with pytest.raises(ValueError, match="--require"):
        exit_code_of(FAIL, PASS, "some")


def test_an_asked_configuration_with_nothing_to_gain_still_exits_0_and_the_line_says_none_to_deploy():
    # Every layer kept: it passes as asked, but holds no more KV than `auto`, so the deploy line keeps `auto`.
    from kveval.render.verdict_section import decision_line

    by_spec = {"fp8:keep=0,1,2": {8192: PASS}}
    plain, deployable, code, any_code = _codes(by_spec, _deployment(), asked=("fp8:keep=0,1,2",))
    assert (plain, deployable, code, any_code) == (PASS, FAIL, EXIT_PASS, EXIT_PASS)
    decision = schema.Decision(asked=plain, asked_configurations=["fp8:keep=0,1,2"], deployable=deployable,
                               configuration=None, passes_at=[], max_model_len=None, exit_code=code,
                               exit_code_require_any=any_code)
    assert decision_line(decision) == ("Deployable FP8 configuration: **FAIL** (none to deploy) · exit code 0: "
                                       "deployable as asked")
