"""Operating characteristics of the gate at its margins, by simulation through the real stream rules
(scripts/simulate_gate.py): a cell whose truth sits exactly at a PASS margin must PASS at most alpha of the
time, one exactly at a harm bar must FAIL at most fail_alpha of the time on each FAIL path. Each rate may
exceed its level by at most 3 Monte Carlo standard errors (of a rate at that level). Every stream runs its
rounds: divergence scores new documents in scoring rounds, each look judged at its Lan-DeMets level, the
last look final, as tasks and degeneration do. Seeded; small sizes."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from kveval.gate import FAIL, PASS, Thresholds

_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "simulate_gate.py"
_spec = importlib.util.spec_from_file_location("simulate_gate", _SCRIPT)
sim = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("simulate_gate", sim)   # dataclasses look their module up there
_spec.loader.exec_module(sim)

T = Thresholds()
DESIGNS = sim.default_designs()
RUNS = {"divergence": 2000, "tasks": 2000, "degeneration": 2000}
# cpu-amx differs from cpu only in its divergence budgets (its task and probe designs are the CPU's), so only
# its divergence stream is simulated.
CASES = [(profile, stream) for profile in ("cpu", "cpu-amx", "gpu") for stream in ("divergence", "tasks", "degeneration")
         if profile != "cpu-amx" or stream == "divergence"]


def allowed(level: float, runs: int) -> float:
    return level + 3 * math.sqrt(level * (1 - level) / runs)


def _scenario(profile: str, name: str):
    (found,) = [s for s in sim.scenarios(profile, T) if s.name == name]
    return found


def _statuses(profile: str, stream: str, name: str, seed: int):
    """Each setting of the stream in the scenario: (label, result of the simulation)."""
    scenario, design, runs = _scenario(profile, name), DESIGNS[profile], RUNS[stream]
    rng = np.random.default_rng(seed)
    if stream == "divergence":
        return [(f"KL {kl:g}", sim.simulate_divergence(rng, design, kl, runs, T)) for kl in scenario.kl]
    if stream == "tasks":
        return [(f"accuracy {acc:g}", sim.simulate_tasks(rng, design, acc, scenario.recovery, runs, T))
                for acc in sim.ACCURACIES]
    return [(f"loops {a:g}->{c:g}", sim.simulate_degeneration(rng, design, a, c, runs, T)) for a, c in scenario.loops]


@pytest.mark.parametrize("profile,stream", CASES)
def test_false_pass_at_the_pass_margin_is_at_most_alpha(profile, stream):
    for label, result in _statuses(profile, stream, "at PASS margin", seed=1):
        rate = float(np.mean(result["status"] == PASS))
        assert rate <= allowed(T.alpha, len(result["status"])), f"{profile} {stream} {label}: false PASS {rate:.3f}"


@pytest.mark.parametrize("profile,stream", CASES)
def test_false_fail_at_the_harm_bar_is_at_most_fail_alpha_per_path(profile, stream):
    for label, result in _statuses(profile, stream, "at harm bar", seed=2):
        runs = len(result["status"])
        if stream == "divergence":   # two FAIL paths: each on its own
            for path in ("kl_mean", "kl_late_mean"):
                rate = float(np.mean(result["paths"][path] == False))  # noqa: E712
                assert rate <= allowed(T.fail_alpha, runs), f"{profile} {path} {label}: false FAIL {rate:.4f}"
        else:
            rate = float(np.mean(result["status"] == FAIL))
            assert rate <= allowed(T.fail_alpha, runs), f"{profile} {stream} {label}: false FAIL {rate:.4f}"


def test_schedules_follow_the_designs():
    assert sim.schedule(54, 600) == [54, 108, 216, 432, 600]
    assert sim.schedule(270, 600) == [270, 540]           # 60 more would not be worth a round
    assert sim.schedule(105, 600, sim.MIN_PROBE_ROUND) == [105, 210, 420, 600]


def test_divergence_looks_follow_the_scoring_rounds():
    """The real planner's scoring rounds (run/round_plan._scoring_want): scored sequences (documents and the
    first look's 9 continuations) double up to MAX_SCORED_SEQUENCES, a round only while it adds a quarter."""
    assert DESIGNS["cpu"].divergence_looks() == [21, 42]      # 12 -> 33 documents; 48 would add only 6
    assert DESIGNS["gpu"].divergence_looks() == [33, 48]      # 24 -> 39 documents
    assert sim.default_designs({"cpu": 8})["cpu"].divergence_looks() == [17, 34, 48]   # the quick suite
    assert sim.default_designs(documents_max=0)["cpu"].divergence_looks() == [21]      # no rounds: one look
    n, late = DESIGNS["cpu"].all_sequences()
    assert len(n) == 42 and (late[21:] > 0).all()   # the round's new documents all reach the late half


def test_divergence_stops_at_its_first_decided_look():
    rng = np.random.default_rng(3)
    healthy = sim.simulate_divergence(rng, DESIGNS["cpu"], 0.018, 200, T)
    assert (healthy["status"] == PASS).all() and (healthy["used"] == 12).all()   # decided at the first look
    margin = sim.simulate_divergence(rng, DESIGNS["cpu"], T.budget("cpu").kl_mean_max, 200, T)
    undecided = margin["status"] != PASS
    assert (margin["stopped"][undecided] == 1).all() and (margin["used"][undecided] == 33).all()
