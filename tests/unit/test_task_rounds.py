"""Task evidence until decided (run/round_plan.py, run/rounds.py, files/task_rounds.py): which cells get
another round, its size under the budget, how round samples join the cell's evidence, and the whole
loop with a stand-in for the cell process (no engine)."""
from __future__ import annotations

import dataclasses
import json
import re
from types import SimpleNamespace

import pytest

from kveval.analysis.noninferiority import paired_recovery_upper_bound
from kveval.analysis.sequential import final_look_alpha
from kveval.analysis.task_accuracy import task_evidence
from kveval.errors import KvevalError
from kveval.files import schema
from kveval.files.rundir import RunDir, write_json_atomic
from kveval.files.task_rounds import RoundDesign, merge_rounds, round_cell_id
from kveval.gate import FAIL, INCONCLUSIVE, PASS, Check, Reason, Thresholds, Verdict
from kveval.inputs.budget import for_platform, parse_budget
from kveval.inputs.kvspec import KVSpec
from kveval.inputs.suites import SUITES
from kveval.run import cells as cells_module
from kveval.run.cell_process import stored_cell
from kveval.run import rounds as rounds_module
from kveval.run.cells import run_plans
from kveval.run.settings import build_phase_options
from kveval.run.setup import RunSetup
from kveval.run.state import RunState
from kveval.run.options import CompareOptions, validate_options
from kveval.run.round_plan import Costs, LengthShape, plan_round, undecided_by_tasks
from tests.support.constructed import failed_cell, planned_manifest, scoring_phase, started_cell
from tests.support.evidence import typed_cells, typed_evidence
from tests.support.quiet import Quiet
from tests.support.task_samples import sample, with_tasks

T = Thresholds()


# --- --budget -----------------------------------------------------------------------------------------

def test_budget_forms_and_default():
    assert parse_budget(None).samples == 600 and parse_budget(None).seconds == 1200
    assert (parse_budget("400").samples, parse_budget("400").seconds) == (400, None)
    assert (parse_budget("10m").samples, parse_budget("10m").seconds) == (600, 600)
    assert parse_budget("90s").seconds == 90 and parse_budget("1.5h").seconds == 5400
    assert (parse_budget("300,5m").samples, parse_budget("300,5m").seconds) == (300, 300)
    assert parse_budget("off").samples == 0 and parse_budget(0).samples == 0


def test_gpu_default_budget_is_1200_samples_and_a_users_count_is_kept():
    # A GPU scores samples in milliseconds: its default cap (the design's N_max) is 1200, where a healthy cell
    # with 15 % looping outputs PASSes >= 90 % of simulated runs (docs/statistics.md); a CPU keeps 600.
    assert parse_budget(for_platform(None, on_gpu=True)).samples == 1200
    assert parse_budget(for_platform(None, on_gpu=True)).seconds == 1200
    assert parse_budget(for_platform("10m", on_gpu=True)).samples == 1200
    assert parse_budget(for_platform("10m", on_gpu=True)).seconds == 600
    assert for_platform("400", on_gpu=True) == "400" and for_platform("off", on_gpu=True) == "off"
    assert for_platform(None, on_gpu=False) is None and for_platform("10m", on_gpu=False) == "10m"


@pytest.mark.parametrize("bad", ["ten", "-5", "5x", "10m,20m", "0,5m", "1.5", ""])
def test_bad_budget_is_one_clear_usage_error_before_any_engine(bad):
    with pytest.raises(KvevalError, match=r"^--budget .*(samples|more than 0|turns rounds off)") as error:
        validate_options(CompareOptions(budget=bad))
    assert "\n" not in str(error.value)


def test_bad_budget_on_the_command_line_exits_2(tmp_path):
    from click.testing import CliRunner

    from kveval.cli.commands import cli

    result = CliRunner().invoke(cli, ["compare", "--budget", "soon", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--budget 'soon'" in result.output
    assert not (tmp_path / "r").exists()


# --- which cells get another round ------------------------------------------------------------------

def _verdict(statuses: dict, reasons: list[Reason], checks: list[Check]) -> Verdict:
    return Verdict(INCONCLUSIVE, reasons, checks, cells=statuses)


def _task_open(cell):
    return (Reason(INCONCLUSIVE, cell, f"{cell}: task accuracy not shown non-inferior"),
            Check("task_noninferiority", cell, 0.5, 0.9, None))


def test_only_cells_undecided_by_tasks_alone_get_rounds():
    reason, check = _task_open("fp8-1024")
    other_reason, other_check = _task_open("fp8-2048")
    verdict = _verdict({"fp8-1024": INCONCLUSIVE, "fp8-2048": INCONCLUSIVE, "fp8-4096": FAIL},
                       [reason, other_reason, Reason(INCONCLUSIVE, "fp8-2048", "fp8-2048: KL mean outside the budget"),
                        Reason(FAIL, "fp8-4096", "harm")],
                       [check, other_check, Check("task_noninferiority", "fp8-4096", 0.2, 0.9, None)])
    assert undecided_by_tasks(verdict, "fp8-1024")
    assert not undecided_by_tasks(verdict, "fp8-2048")     # divergence undecided too: more tasks cannot PASS it
    assert not undecided_by_tasks(verdict, "fp8-4096")     # FAIL already


def _evidence(cells: dict[str, dict]) -> schema.Evidence:
    return typed_evidence({"tasks": {"cells": cells, "accuracy": [
        {"cell": name, "level": "cell", "samples": entry["n"]} for name, entry in cells.items()]}})


def _entry(n, b, c, acc=0.8, length=1024, looks=None):
    return {"reference": f"auto-{length}", "max_model_len": length, "n": n, "b": b, "c": c,
            "baseline_accuracy": acc, "recovery": 1 + (c - b) / n / acc, "looks": looks or [n]}


def test_round_sizes_double_at_least_and_share_a_length():
    reasons, checks = zip(*[_task_open("fp8-1024"), _task_open("fp8:keep=0-1024"), _task_open("fp8-2048")])
    verdict = _verdict({c.cell: INCONCLUSIVE for c in checks}, list(reasons), list(checks))
    evidence = _evidence({"fp8-1024": _entry(12, 1, 1), "fp8:keep=0-1024": _entry(12, 0, 0),
                          "fp8-2048": _entry(30, 2, 1, length=2048)})
    plan = plan_round(verdict, evidence, parse_budget("600"), T, {1024: LengthShape(6, 12), 2048: LengthShape(6, 12)},
                      None, 0.0)
    first, second = plan.rounds
    assert (first.max_model_len, first.reference, first.cells) == (1024, "auto-1024", ["fp8-1024", "fp8:keep=0-1024"])
    assert first.all_cells[0] == "auto-1024"
    assert first.target >= 24 and first.docs >= 12 and first.samples_per_point == -(-first.docs // 12)
    assert second.max_model_len == 2048 and second.target >= 60


def test_round_sizes_stop_at_the_budget():
    reason, check = _task_open("fp8-1024")
    verdict = _verdict({"fp8-1024": INCONCLUSIVE}, [reason], [check])
    shapes = {1024: LengthShape(6, 12)}
    capped = plan_round(verdict, _evidence({"fp8-1024": _entry(40, 3, 2)}), parse_budget("50"), T, shapes, None, 0)
    assert capped.rounds[0].target == 50 and capped.rounds[0].docs == 10
    assert capped.rounds[0].limit == 1                       # 10 docs over 6 tasks: 1 each, not past the budget
    spent = plan_round(verdict, _evidence({"fp8-1024": _entry(50, 3, 2)}), parse_budget("50"), T, shapes, None, 0)
    assert not spent.rounds and "budget of 50 paired samples per cell is spent" in spent.notes[0]
    # Round time: 2 cells × (30 s start + docs × 2 s) must fit what is left of 5 min.
    costs = Costs(startup_seconds=30, seconds_per_doc=2)
    timed = plan_round(verdict, _evidence({"fp8-1024": _entry(40, 3, 2)}), parse_budget("600,5m"), T, shapes, costs, 0)
    assert 2 * (30 + timed.rounds[0].docs * 2) <= 300
    late = plan_round(verdict, _evidence({"fp8-1024": _entry(40, 3, 2)}), parse_budget("600,5m"), T, shapes, costs, 290)
    assert not late.rounds and "round time is spent" in late.notes[0]
    none = plan_round(verdict, _evidence({"fp8-1024": _entry(40, 3, 2)}), parse_budget("600"), T, {}, None, 0)
    assert not none.rounds and "only kveval's own tasks" in none.notes[0]


def test_a_cell_undecided_on_another_count_gets_rounds_only_where_a_drop_could_be_shown():
    # Healthy SmolLM2 at 2048 on the AVX-512 CPU, every setting default: degeneration undecided (12 vs 7 of
    # 109) and tasks 3 vs 0 of 54 (recovery 88 %). No PASS can come of more tasks, but a FAIL can.
    degeneration = Reason(INCONCLUSIVE, "fp8-2048", "fp8-2048: 12 of 109 outputs degenerate where the auto output "
                                                    "does not")
    reason, check = _task_open("fp8-2048")
    verdict = _verdict({"fp8-2048": INCONCLUSIVE}, [degeneration, reason], [check])
    shapes = {2048: LengthShape(6, 54)}
    dropping = plan_round(verdict, _evidence({"fp8-2048": _entry(54, 3, 0, acc=0.463, length=2048)}),
                          parse_budget("600"), T, shapes, None, 0)
    assert [r.cells for r in dropping.rounds] == [["fp8-2048"]] and dropping.rounds[0].target >= 108
    steady = plan_round(verdict, _evidence({"fp8-2048": _entry(54, 1, 1, acc=0.463, length=2048)}),
                        parse_budget("600"), T, shapes, None, 0)
    assert not steady.rounds
    assert steady.notes == ["fp8-2048: no task round: another count keeps it undecided, which task samples cannot "
                            "settle, and its recovery is not under 90.0 %"]
    # The bar is task_recovery_min (0.90 since the three-zone gate): 2 vs 0 of 54 recovers 92 %, under the
    # retired 95 % bar but not under 90 %, so no round is spent on it either.
    slight = plan_round(verdict, _evidence({"fp8-2048": _entry(54, 2, 0, acc=0.463, length=2048)}),
                        parse_budget("600"), T, shapes, None, 0)
    assert not slight.rounds and "recovery is not under 90.0 %" in slight.notes[0]


# --- round samples join the cell --------------------------------------------------------------------

def _samples(round_number, count, wrong=frozenset(), length=1024):
    """Passkey samples of one round; ids differ per round (as the data generator's -r<k> suffix)."""
    return [sample("kveval_passkey", i, length=length, seed=round_number, correct=i not in wrong)
            for i in range(count)]


def _round_record(cell, kv, round_number, samples, seconds=10.0):
    facts = with_tasks(started_cell(kv, 1024, 4096, []), samples)
    facts.update(cell=round_cell_id(cell, round_number), process={"exit_code": 0, "seconds": seconds})
    return facts


def test_merge_tags_rounds_and_keeps_a_failed_round_apart():
    cell = with_tasks(started_cell("fp8", 1024, 4096, []), _samples(0, 4))
    failed = {**failed_cell("fp8", 1024, reason="oom", message="CUDA OOM"), "cell": "fp8-1024.tasks-r2"}
    merged = merge_rounds(cell, [(1, _round_record("fp8-1024", "fp8", 1, _samples(1, 3))), (2, failed)],
                          RoundDesign(n_max=600, final=True, stopped="budget"))
    tasks = merged["phases"]["tasks"]
    assert [s["round"] for s in tasks["samples"]] == [0] * 4 + [1] * 3
    assert tasks["design"] == {"n_max": 600, "final": True, "stopped": "budget"}
    assert tasks["rounds"][1]["samples"] == 0 and tasks["rounds"][1]["error"] == "CUDA OOM"
    assert "error" not in tasks and cell["phases"]["tasks"].get("rounds") is None   # the original is untouched


def test_pooled_rounds_pair_by_sample_id_and_give_the_looks():
    auto = with_tasks(started_cell("auto", 1024, 2048, []), _samples(0, 12))
    fp8 = with_tasks(started_cell("fp8", 1024, 4096, []), _samples(0, 12, wrong={3}))
    cells = {"auto-1024": merge_rounds(auto, [(1, _round_record("auto-1024", "auto", 1, _samples(1, 24)))],
                                       RoundDesign(n_max=600, final=False)),
             "fp8-1024": merge_rounds(fp8, [(1, _round_record("fp8-1024", "fp8", 1, _samples(1, 24, wrong={0, 1})))],
                                      RoundDesign(n_max=600, final=True))}
    entry = task_evidence(typed_cells(cells))["cells"]["fp8-1024"]
    assert entry["n"] == 36 and entry["b"] == 3 and entry["c"] == 0
    assert entry["looks"] == [12, 36] and entry["n_max"] == 600 and entry["final"] is True


def test_a_larger_budget_keeps_the_n_max_each_earlier_look_was_taken_under():
    from kveval.files.task_rounds import design_of

    def entry(number, n_max=None):
        return {"round": number, "max_model_len": 1024, "cells": ["auto-1024", "fp8-1024"], "data_dir": None,
                "samples_per_point": 1, "limit": None, "target": 24 * 2 ** (number - 1), "n_max": n_max}

    earlier = schema.TaskRounds.model_validate({"budget": {}, "n_max": 96, "rounds": [entry(1), entry(2)],
                                                "final": ["fp8-1024"], "stopped": "budget", "notes": []})
    # Rounds the earlier record planned are planned again under its N_max; the first look's too.
    assert rounds_module._earlier_caps(earlier, 384) == {0: 96, 1: 96, 2: 96}
    assert rounds_module._earlier_caps(earlier, 48) == {0: 48, 1: 48, 2: 48}    # never above this run's
    assert rounds_module._earlier_caps(None, 384) == {}
    extended = schema.TaskRounds.model_validate({"budget": {}, "n_max": 384, "first_n_max": 96, "final": [],
                                                 "rounds": [entry(1, 96), entry(2, 96), entry(3, 384)],
                                                 "stopped": None, "notes": []})
    manifest = SimpleNamespace(task_rounds=extended)
    design = design_of(manifest, "fp8-1024")
    assert design is not None and design.n_max == 384 and design.n_max_rounds == [96, 96, 96, 384]
    merged = merge_rounds(with_tasks(started_cell("fp8", 1024, 4096, []), _samples(0, 4)), [], design)
    assert merged["phases"]["tasks"]["design"]["n_max_rounds"] == [96, 96, 96, 384]
    # One N_max throughout: no per-round list (the design reads as before).
    assert design_of(SimpleNamespace(task_rounds=earlier), "fp8-1024").n_max_rounds is None


# --- the loop, with a stand-in for the cell process ---------------------------------------------------

DOCS_PER_STEP = 12


def _run_dir(tmp_path, budget, fp8_wrong=frozenset()):
    """auto-1024 and fp8-1024 with healthy divergence and 12 paired passkey samples."""
    run = RunDir(tmp_path / "run")
    cells = {"auto-1024": with_tasks(started_cell("auto", 1024, 1792, [], scoring_phase(1000, "same", noise_shape="same")),
                                     _samples(0, 12)),
             "fp8-1024": with_tasks(started_cell("fp8", 1024, 3584, [], scoring_phase(1000, "healthy")),
                                    _samples(0, 12, wrong=fp8_wrong))}
    for facts in cells.values():
        facts["phases"]["tasks"]["seconds"] = 12.0
    manifest = planned_manifest([{"id": n, "kv_spec": c["kv_spec"], "max_model_len": 1024}
                                 for n, c in cells.items()])
    manifest["options"].update(tasks=["kveval_passkey"], phases=["generation", "scoring", "tasks", "speed"],
                               lengths=[0.25], depths=[0.5], samples_per_point=1, seed=0,
                               budget=parse_budget(budget).to_dict())
    manifest["task_data"] = {"data_dirs": {"1024": "taskdata/L1024"}, "skipped": {},
                             "files": {"1024": {"kveval_passkey": {"file": "kveval_passkey.jsonl", "docs": 12,
                                                                   "skipped": {}}}}}
    state = RunState.write_new(run, manifest)
    write_json_atomic(run.workloads_path, [])
    for name, facts in cells.items():
        write_json_atomic(run.cell_path(name), facts)
    options = CompareOptions(kv=("fp8", "auto"), max_model_len=(1024,), phases=("scoring", "tasks"), budget=budget)
    phase_options = build_phase_options(options, SUITES["quick"], [], ["kveval_passkey"])
    setup = RunSetup(options, run, SimpleNamespace(path="/m"), state, [], phase_options, None, True)
    return setup


class StandIn:
    """write_task_data and run_cell_process without tokenizer or engine: a round's data is noted,
    and a round cell answers its docs (the fp8 cell wrong on every index in `fp8_wrong`)."""

    def __init__(self, fp8_wrong=frozenset()):
        self.written, self.ran, self.fp8_wrong = {}, [], fp8_wrong

    def write_task_data(self, tokenizer, out_dir, length, tasks, *, samples_per_point, round_number, **_):
        self.written[round_number] = samples_per_point * DOCS_PER_STEP
        return {}

    def run_cell_process(self, run_dir, plan, *, timeout_s, on_event, env=None, stop=None, stall_s=None, warm=None):
        number = int(re.search(r"tasks-r(\d+)$", plan.id).group(1))
        options = plan.phase_options.tasks
        assert plan.phases == ["tasks"] and options.data_dir == f"taskdata/L1024/r{number}"
        count = self.written[number] if options.limit is None else options.limit
        wrong = self.fp8_wrong if plan.kv.text == "fp8" else frozenset()
        facts = _round_record(plan.id.split(".tasks-")[0], plan.kv.text, number,
                              _samples(number, count, wrong=wrong), seconds=20.0)
        facts["cell"] = plan.id
        self.ran.append(plan.id)
        return stored_cell(run_dir, plan.id, facts)


def _loop(setup, stand_in, monkeypatch):
    monkeypatch.setattr(rounds_module, "load_tokenizer", lambda *a, **k: None)
    monkeypatch.setattr(rounds_module, "write_task_data", stand_in.write_task_data)
    monkeypatch.setattr(cells_module, "run_cell_process", stand_in.run_cell_process)
    rounds_module.run_task_rounds(setup, T, Quiet(), lambda plans: run_plans(setup.run, plans, True, setup.options,
                                                                                Quiet()))
    from kveval.pipeline import judge_stored_run

    manifest = setup.run.manifest()
    return schema.dump(manifest), judge_stored_run(setup.run, manifest, setup.run.cell_results(manifest), T)


@pytest.fixture(scope="module")
def healthy_loop(tmp_path_factory):
    """The whole loop once for a healthy fp8 cell on budget 600: read by the test of its rounds and
    resumed by the resume test (which only adds to the run directory, never changes what is read here)."""
    setup, stand_in = _run_dir(tmp_path_factory.mktemp("healthy"), "600"), StandIn()
    with pytest.MonkeyPatch.context() as monkeypatch:
        manifest, review = _loop(setup, stand_in, monkeypatch)
    return setup, stand_in, manifest, review


def test_a_healthy_cell_gets_rounds_until_it_passes(healthy_loop):
    _, stand_in, manifest, review = healthy_loop
    record = manifest["task_rounds"]
    assert review.verdict.cells["fp8-1024"] == PASS
    targets = [r["target"] for r in record["rounds"]]
    assert targets[0] >= 24 and all(b >= 2 * a or b == 600 for a, b in zip([12] + targets, targets))
    assert all(r["cells"] == ["auto-1024", "fp8-1024"] for r in record["rounds"])
    entry = review.evidence.tasks.cells["fp8-1024"]
    assert entry.looks[0] == 12 and entry.looks == sorted(entry.looks) and len(entry.looks) == len(targets) + 1
    assert entry.final is False and record["final"] == []            # decided at a look of the design
    assert stand_in.ran == [round_cell_id(c, r["round"]) for r in record["rounds"] for c in r["cells"]]
    assert any("look" in c.detail and c.passed for c in review.verdict.checks if c.name == "task_noninferiority")


def test_a_resumed_run_reuses_finished_rounds(healthy_loop, monkeypatch):
    setup, stand_in, first, _ = healthy_loop
    assert stand_in.ran                                 # the first run did run rounds
    setup.state = RunState(setup.run, setup.run.manifest())   # as a resume reads it back
    again = StandIn()
    second, review = _loop(setup, again, monkeypatch)
    assert again.ran == [] and second["task_rounds"] == first["task_rounds"]
    assert review.verdict.cells["fp8-1024"] == PASS


def test_budget_spent_undecided_says_how_many_samples_would_decide(tmp_path, monkeypatch):
    # One answer in 8 lost (every round's indices 0, 8, 16, ...: 2 + 2 + 3 = 7 of 48, auto all right):
    # recovery 85.4 %, under the harm bar 90 % but not shown under it on 48 samples. (One in 16 gave 4 of 48,
    # recovery 91.7 %: above the bar, so no sample count would show harm, and rightly no drop hint.)
    wrong = frozenset(range(0, 400, 8))
    setup, stand_in = _run_dir(tmp_path, "48", fp8_wrong=wrong), StandIn(fp8_wrong=wrong)
    manifest, review = _loop(setup, stand_in, monkeypatch)
    record = manifest["task_rounds"]
    assert record["rounds"] and all(r["target"] <= 48 for r in record["rounds"])
    assert record["final"] == ["fp8-1024"] and "spent" in record["stopped"]
    assert review.verdict.cells["fp8-1024"] == INCONCLUSIVE
    (reason,) = [r for r in review.verdict.reasons if r.cell == "fp8-1024" and r.level == INCONCLUSIVE]
    assert "unlikely" not in reason.decide and "--full" not in reason.decide
    assert "is not 2 points above the margin" in reason.decide and "that is the finding" in reason.decide
    entry = review.evidence.tasks.cells["fp8-1024"]
    assert (entry.n, entry.b, entry.c, entry.baseline_accuracy) == (48, 7, 0, 1.0)
    found = re.search(r"about (\d+) paired samples per cell would show whether it is under the harm bar 90\.0 % "
                      r"\(--budget (\d+)\)", reason.decide)
    assert found and found.group(1) == found.group(2)
    # The count is the fewest samples at which, the observed shares held (7 in 48 only auto right), the
    # recovery's upper bound falls under the harm bar at the FAIL level of a design's last look.
    need, level = int(found.group(1)), final_look_alpha(T.fail_alpha)
    assert paired_recovery_upper_bound(need, need * 7 / 48, 0, 1.0, level) < T.task_recovery_min
    assert paired_recovery_upper_bound(need - 1, (need - 1) * 7 / 48, 0, 1.0, level) >= T.task_recovery_min
    assert "the final look" in next(c.detail for c in review.verdict.checks if c.name == "task_noninferiority")
    stored = json.loads(setup.run.results_path.read_text())
    assert stored["evidence"]["tasks"]["cells"]["fp8-1024"]["n_max"] == 48


def test_no_rounds_with_budget_off(tmp_path, monkeypatch):
    setup, stand_in = _run_dir(tmp_path, "off"), StandIn()
    manifest, review = _loop(setup, stand_in, monkeypatch)
    assert stand_in.ran == [] and "task_rounds" not in manifest
    assert review.evidence.tasks.cells["fp8-1024"].n_max is None   # one fixed-sample look, as before


def test_a_quality_reference_keeps_its_own_kv_budget_in_rounds(tmp_path):
    # Seen in the demo: the round of auto-2048.reference took the run's 40 MiB and failed kv_capacity.
    from kveval.run.round_plan import LengthRound

    setup = _run_dir(tmp_path, "600")
    setup.options = CompareOptions(kv=("fp8", "auto"), max_model_len=(2048,), phases=("scoring", "tasks"),
                                   budget="600", kv_cache_memory="40MiB")
    setup.state.change(quality_references={"auto-2048.reference": {"for": "auto-2048",
                                                                   "kv_cache_memory_bytes": 80 * 2 ** 20, "why": "..."}})
    references = setup.state.manifest.quality_references
    plans = rounds_module._round_plans(setup, 1, LengthRound(2048, "auto-2048.reference", ["fp8-2048"], 24, 12, 1, None),
                                       "taskdata/L2048/r1", None, {"auto-2048.reference": KVSpec("auto"), "fp8-2048": KVSpec("fp8")},
                                       references)
    budgets = {plan.id: plan.engine["kv_cache_memory_bytes"] for plan in plans}
    assert budgets == {"auto-2048.reference.tasks-r1": 80 * 2 ** 20, "fp8-2048.tasks-r1": 40 * 2 ** 20}



def test_a_larger_budget_on_a_finished_run_replays_its_rounds_and_reopens_no_final_look(tmp_path, monkeypatch):
    # The undecided run of the test above, resumed with --budget 600: its rounds are replayed from the stored
    # cells (none runs again), and the task comparison whose last look was final (all its alpha spent) gets
    # no new samples: the verdict is the one the first run gave.
    wrong = frozenset(range(0, 400, 8))
    setup, stand_in = _run_dir(tmp_path, "48", fp8_wrong=wrong), StandIn(fp8_wrong=wrong)
    first, _ = _loop(setup, stand_in, monkeypatch)
    assert first["task_rounds"]["final"] == ["fp8-1024"]
    setup.options = dataclasses.replace(setup.options, budget="600")
    # As prepare_run_dir carries the rounds' record on a resume.
    setup.state.change(options={**schema.dump(setup.state.manifest.options), "budget": parse_budget("600").to_dict()},
                       task_rounds=first["task_rounds"])
    again = StandIn(fp8_wrong=wrong)
    second, review = _loop(setup, again, monkeypatch)
    assert again.ran == []
    assert [r["round"] for r in second["task_rounds"]["rounds"]] == [r["round"] for r in first["task_rounds"]["rounds"]]
    assert any("no task round: its last look was final" in note for note in second["task_rounds"]["notes"])
    assert review.verdict.cells["fp8-1024"] == INCONCLUSIVE
    assert review.evidence.tasks.cells["fp8-1024"].n == 48


def test_the_gate_tests_each_look_under_the_n_max_it_was_taken_under():
    from kveval.analysis.sequential import look_alpha, look_caps
    from kveval.gate import evaluate

    # Looks after rounds 0, 1 and 3 (the cell sat out round 2) of a design extended from 96 to 384 at round 3.
    assert look_caps([0, 1, 3], 384, [96, 96, 96, 384]) == [96, 96, 384]
    assert look_caps([0, 1, 4], 384, [96, 96]) == [96, 96, 384]
    assert look_caps([0, 1], 96, None) is None
    from tests.unit.test_gate import evidence

    entry = {**_entry(200, 20, 18, length=8192, looks=[24, 48, 200]), "n_max": 384, "final": False}
    one_design = evaluate(evidence(tasks=entry))
    extended = evaluate(evidence(tasks={**entry, "n_max_looks": [96, 96, 384]}))

    def detail(verdict):
        return next(c.detail for c in verdict.checks if c.name == "task_noninferiority")

    level = look_alpha([24, 48, 200], [96, 96, 384], T.alpha, False).alpha
    assert level != look_alpha([24, 48, 200], 384, T.alpha, False).alpha
    assert f"{level:.2g}" in detail(extended) and detail(extended) != detail(one_design)
