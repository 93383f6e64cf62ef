"""Operating characteristics of the gate, by simulation: PASS / FAIL / INCONCLUSIVE rates per evidence stream
and per tested cell, from the REAL rules of kveval/gate/ (`_divergence`, `_tasks`, `_degeneration`, each run
on a `_Collector` as `evaluate` runs them) over simulated paired data.

Data model (every parameter is printed with the tables and can be changed from the command line):

- Divergence (scoring rounds). The first look scores the suite's sequences: `--documents` teacher-forced
  documents (CPU profile: the standard suite's 12 at max_model_len 2048; GPU profile: the full suite's 24 at
  8192), sizes spread evenly over 55-90 % of max_model_len (kveval/inputs/suites.py), each scored from
  position 1, its late positions those at or after max_model_len / 2; plus the 9 prompt continuations of the
  standard prompt set, with the positions they scored in reports/cpu-probe-rounds-smollm2-2048 (CPU) and
  reports/h200-smollm2-8192-defaults (GPU); only ctx_90pct reaches the late half. A cell the look leaves
  undecided scores new documents in rounds (run/rounds.py), the same size distribution (a round of k
  documents: k sizes spread evenly over 55-90 %, as run/plan.scoring_documents draws them), no new
  continuations. The rounds' sizes are the real planner's (run/round_plan._scoring_want, driven here): the
  scored sequences (the test's clusters, continuations included) double from the first look
  (next_look_size) up to `--documents-max` (round_plan.MAX_SCORED_SEQUENCES, 48), a round taken only while it adds
  at least a quarter of the sequences so far: CPU 21 -> 42 sequences (12 -> 33 documents), GPU 33 -> 48
  (24 -> 39). Each look is judged by the real `_divergence` on a Comparison carrying `looks` (sequences
  at each look, from the second look on, as analysis/divergence.py sets it) and `design` (n_max, final
  True at the schedule's last look, as run/rounds._finish marks a cell still open when no round is left),
  so it tests at the nominal level of the exact Lan-DeMets boundary (gate/divergence_checks.look_levels);
  the stream stops at its first decided look. `--documents-max 0`: no design, one look at the
  fixed-sample levels (a run without rounds). Each sequence g carries a
  log-normal multiplier M_g (mean 1, coefficient of variation `--cv`, default 0.5: the CV of the sequence KL
  means of ten healthy published runs is 0.34-1.10, median 0.45, see the report in docs/statistics.md). Its
  KL sum is M_g (mu_early n_early,g + mu_late n_late,g); mu_late = the profile's late budget / mean budget
  times the true KL mean, mu_early set so that the position-weighted mean over the first look is the true
  KL mean (the late KL is the true late KL at every look; the overall KL's expectation over the CPU's 42
  sequences is 1 % above it, the documents' share of late positions being larger than the continuations',
  over the GPU's 48 0.1 %). Top-1 disagreement per sequence 0.55 sqrt(KL_g) (the fit to the same runs;
  0.905 at KL 0.03), the agreeing positions binomial. No noise floor (the KL is the excess over it). The
  comparison's clustered figures come from kveval.analysis.cluster_interval.cluster_mean, as
  analysis/divergence.py computes them. "mean used" is the documents scored per cell (continuations not
  counted).
- Tasks (rounds). Paired samples, independent across samples: baseline right with probability `acc`; the
  discordant shares c = delta (only the cell right) and b = delta + (1 - R) acc (only the baseline right),
  delta = 0.03 (healthy H200 runs: 5-11 of 270 each way), so the cell's accuracy is R acc. Looks at
  n_1, 2 n_1, ... (kveval.analysis.sequential.next_look_size) up to `--budget` paired samples per cell, a
  round taken only while it adds at least a quarter of the samples so far (run/round_plan.py), the last
  look final; the stream stops at its first decided look. n_1 = 54 (CPU, standard suite: 6 tasks x 3 sizes
  x 3 depths) and 270 (GPU, full suite: 5 samples per point).
- Degeneration (rounds). Paired loop indicators per probe: the baseline loops with probability p_a, the
  cell with p_c, with within-prompt correlation rho = 0.4 (phi coefficient; 0.34-0.41 in
  reports/cpu-probe-rounds-smollm2-2048, h200-smollm2-8192-defaults, h200-planted-layers-batched). Looks
  from 105 judged outputs doubling (at least 50 new probes a round) up to `--budget`, the same rules.
- The cell: the three streams drawn independently; FAIL when any stream FAILs (at any of its looks), PASS
  when all three PASS, else INCONCLUSIVE. (The real round planner also stops sampling a stream whose cell is
  held open by another stream that rounds cannot settle, unless its own figure leans to harm; here every
  stream runs its own schedule, so the cell's FAIL rate is if anything an upper bound.)

The figures in docs/statistics.md ("Operating characteristics") come from

    python scripts/simulate_gate.py            # --runs 4000, seed 0: about 70 s on one core
"""
from __future__ import annotations

import argparse
import itertools
import math
import sys
import time
from dataclasses import dataclass

import numpy as np

from kveval.analysis.cluster_interval import cluster_mean
from kveval.analysis.sequential import next_look_size
from kveval.files import schema
from kveval.gate.collector import _Collector
from kveval.gate.degeneration_checks import _degeneration
from kveval.gate.divergence_checks import _divergence
from kveval.gate.task_checks import _tasks
from kveval.gate.thresholds import Thresholds
from kveval.gate.verdict import FAIL, INCONCLUSIVE, PASS
from kveval.inputs.budget import DEFAULT_SAMPLES, DEFAULT_SAMPLES_GPU
from kveval.run.round_plan import MAX_SCORED_SEQUENCES, _scoring_want

CELL = "fp8-sim"
OUTCOMES = (PASS, FAIL, INCONCLUSIVE)
MIN_PROBE_ROUND = 50          # run/round_plan.py: new probes per round at least
TASK_DELTA = 0.03             # discordance each way of a healthy cell (share of paired samples)
LOOP_RHO = 0.4                # within-prompt correlation of looping in the baseline and the cell
TOP1_SLOPE = 0.55             # top-1 disagreement = slope * sqrt(KL)

# (positions scored, reaches the late half) of the 9 prompt continuations of the standard prompt set.
CONTINUATIONS = {
    "cpu": [(256, False), (80, False), (78, False), (117, True), (256, False), (161, False), (256, False),
            (512, False), (333, False)],          # reports/cpu-probe-rounds-smollm2-2048
    "gpu": [(256, False), (80, False), (55, False), (256, True), (256, False), (187, False), (256, False),
            (512, False), (485, False)],          # reports/h200-smollm2-8192-defaults
}
CONTINUATIONS["cpu-amx"] = CONTINUATIONS["cpu"]   # the same suite and length; only the kernels differ


@dataclass(frozen=True)
class Design:
    """What one cell measures on a profile's defaults."""

    profile: str
    documents: int
    max_model_len: int
    task_first: int
    probe_first: int = 105
    n_max: int = 600
    cv: float = 0.5
    documents_max: int = MAX_SCORED_SEQUENCES   # the divergence design's N_max in scored sequences (0: no rounds)

    def _documents(self, count: int) -> tuple[list[int], list[int]]:
        """(positions, late positions) of `count` documents sized evenly over 55-90 % of max_model_len."""
        length, half = self.max_model_len, self.max_model_len // 2
        sizes = np.linspace(0.55, 0.9, count) * length if count > 1 else np.array([0.725 * length])
        sizes = np.round(sizes).astype(int)
        return list(sizes - 1), list(np.maximum(0, sizes - half))

    def sequences(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, late positions) per scored sequence of the first look: the documents, then the
        continuations."""
        n, late = self._documents(self.documents)
        for positions, reaches in CONTINUATIONS[self.profile]:
            n.append(positions)
            late.append(positions if reaches else 0)
        return np.array(n, dtype=float), np.array(late, dtype=float)

    def divergence_looks(self) -> list[int]:
        """Scored sequences per cell at each look, as the real round planner sizes the scoring rounds
        (run/round_plan._scoring_want, with the design's N_max in place of MAX_SCORED_SEQUENCES)."""
        looks = [len(self.sequences()[0])]
        if not self.documents_max:
            return looks
        while True:
            figure = schema.ClusterFigure(estimate=0.0, se=None, clusters=looks[-1], positions=0)
            comp = schema.Comparison.model_construct(clustered={"kl_mean": figure}, per_sequence=[],
                                                     looks=looks if len(looks) > 1 else None)
            want = _planned(comp, self.documents_max)
            if want is None:
                return looks
            looks.append(want[0])

    def all_sequences(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions, late positions) of every sequence the design may score: the first look's, then
        each round's new documents (k documents sized evenly, as a round draws them)."""
        n, late = self.sequences()
        looks = self.divergence_looks()
        parts_n, parts_late = [n], [late]
        for before, after in zip(looks, looks[1:]):
            extra_n, extra_late = self._documents(after - before)
            parts_n.append(np.array(extra_n, dtype=float))
            parts_late.append(np.array(extra_late, dtype=float))
        return np.concatenate(parts_n), np.concatenate(parts_late)


def _planned(comp: schema.Comparison, n_max: int) -> tuple[int, int] | None:
    """round_plan._scoring_want under another N_max than MAX_SCORED_SEQUENCES (its module constant, swapped for
    the call)."""
    from kveval.run import round_plan
    kept = round_plan.MAX_SCORED_SEQUENCES
    round_plan.MAX_SCORED_SEQUENCES = n_max
    try:
        return _scoring_want(CELL, comp, [])
    finally:
        round_plan.MAX_SCORED_SEQUENCES = kept


def default_designs(documents: dict[str, int] | None = None, n_max: int | None = None, cv: float = 0.5,
                    documents_max: int = MAX_SCORED_SEQUENCES) -> dict[str, Design]:
    """Each profile's default design; `n_max` None: kveval's own default sample cap there (inputs/budget.py:
    600 on a CPU, 1200 on a GPU)."""
    documents = documents or {}
    cpu_cap = n_max or DEFAULT_SAMPLES
    gpu_cap = n_max or DEFAULT_SAMPLES_GPU
    return {"cpu": Design("cpu", documents.get("cpu", 12), 2048, 54, n_max=cpu_cap, cv=cv, documents_max=documents_max),
            "cpu-amx": Design("cpu-amx", documents.get("cpu-amx", 12), 2048, 54, n_max=cpu_cap, cv=cv,
                              documents_max=documents_max),
            "gpu": Design("gpu", documents.get("gpu", 24), 8192, 270, n_max=gpu_cap, cv=cv, documents_max=documents_max)}


def schedule(first: int, n_max: int, min_step: int = 1) -> list[int]:
    """Planned looks: next_look_size's doubling schedule, a round only while it adds at least a quarter of the
    samples so far (run/round_plan.py's rule)."""
    looks = [min(first, n_max)]
    while looks[-1] < n_max:
        target = next_look_size(looks, n_max, min_step)
        if target - looks[-1] < max(1, looks[-1] // 4):
            break
        looks.append(target)
    return looks


def _status(out: _Collector) -> str:
    levels = out.levels(CELL)
    return FAIL if FAIL in levels else INCONCLUSIVE if INCONCLUSIVE in levels else PASS


# --- divergence ------------------------------------------------------------------------------------

def divergence_comparison(design: Design, sums: np.ndarray, n: np.ndarray, late_sums: np.ndarray,
                          n_late: np.ndarray, agree: np.ndarray, looks: list[int] | None = None,
                          scoring_design: schema.ScoringDesign | None = None) -> schema.Comparison:
    """The typed comparison the gate reads, with its clustered figures computed by analysis' cluster_mean;
    `looks` and `scoring_design` as analysis/divergence.py and files/task_rounds.py attach them."""
    def figure(s, c):
        m = cluster_mean(s, c)
        return schema.ClusterFigure(estimate=m.estimate, se=m.se, clusters=m.clusters, positions=m.positions)

    total, total_late = int(n.sum()), int(n_late.sum())
    kl = float(sums.sum() / total)
    late_kl = float(late_sums.sum() / total_late) if total_late else None
    top1 = float(agree.sum() / total)
    clustered = {"kl_mean": figure(sums, n), "top1_agreement": figure(agree, n)}
    if total_late:
        clustered["kl_late_mean"] = figure(late_sums, n_late)
    return schema.Comparison(
        cell=CELL, reference="auto-sim", kind="kv",
        summary=schema.DivergenceSummary(n=total, kl_mean=kl, kl_p99=None, top1_n=total, top1_agreement=top1),
        late=schema.LateSummary(start=design.max_model_len // 2, n=total_late, kl_mean=late_kl, kl_p99=None, top1_n=0,
                                top1_agreement=None),
        buckets=[], max_position=int(n.max()), by_sequence_kind={}, per_sequence=[], skipped=[], same_length=True,
        kv_spec="fp8", max_model_len=design.max_model_len, clustered=clustered, looks=looks,
        design=scoring_design)


def simulate_divergence(rng: np.random.Generator, design: Design, kl: float, runs: int,
                        t: Thresholds) -> dict:
    """Per run: the stream's status and the kl_mean / kl_late_mean checks' outcomes at the look it stopped
    at (its first decided look, else the last), the documents it scored and the look it stopped at."""
    budget = t.budget(design.profile)
    first_n, first_late = design.sequences()
    first_early = first_n - first_late
    ratio = budget.kl_late_max / budget.kl_mean_max
    mu_late = ratio * kl
    mu_early = max(0.0, (kl * first_n.sum() - mu_late * first_late.sum()) / first_early.sum())
    looks = design.divergence_looks()
    n, n_late = design.all_sequences()
    n_early = n - n_late
    sigma = math.sqrt(math.log(1 + design.cv ** 2))
    # The first look's sequences come from `rng` as they did before rounds (so the other streams, drawn
    # from it after, see the same numbers); the rounds' new documents from a child stream of it.
    rounds = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])
    first = len(first_n)
    z = np.concatenate([rng.standard_normal((runs, first)), rounds.standard_normal((runs, len(n) - first))], axis=1)
    mult = np.exp(sigma * z - sigma ** 2 / 2)
    late_sums = mult * mu_late * n_late
    sums = mult * mu_early * n_early + late_sums
    disagreement = np.minimum(1.0, TOP1_SLOPE * np.sqrt(sums / n))
    agree = np.concatenate([rng.binomial(first_n.astype(int), 1 - disagreement[:, :first]),
                            rounds.binomial(n[first:].astype(int), 1 - disagreement[:, first:])], axis=1).astype(float)
    continuations = len(CONTINUATIONS[design.profile])
    status, used, stopped = [], np.empty(runs), np.empty(runs, dtype=int)
    paths = {"kl_mean": [], "kl_late_mean": [], "top1_agreement": []}
    for i in range(runs):
        for k, m in enumerate(looks):
            last = k == len(looks) - 1
            scoring_design = (schema.ScoringDesign(n_max=design.documents_max, final=last)
                              if design.documents_max else None)
            out = _Collector()
            comp = divergence_comparison(design, sums[i, :m], n[:m], late_sums[i, :m], n_late[:m], agree[i, :m],
                                         looks=looks[:k + 1] if k else None, scoring_design=scoring_design)
            _divergence(out, CELL, comp, "", None, budget, t)
            verdict = _status(out)
            if verdict != INCONCLUSIVE or last:
                break
        status.append(verdict)
        used[i], stopped[i] = m - continuations, k
        checks = {c.name: c.passed for c in out.checks}
        for name in paths:
            paths[name].append(checks.get(name))
    return {"status": np.array(status), "paths": {k: np.array(v, dtype=object) for k, v in paths.items()},
            "used": used, "looks": looks, "stopped": stopped}


# --- tasks -----------------------------------------------------------------------------------------

def _memo(function):
    """The gate is deterministic in its evidence: judge each distinct look once (Thresholds is unhashable,
    so the cache keys on the object's identity; the callers keep it alive)."""
    cache: dict = {}

    def wrapper(*args):
        key = args[:-1] + (id(args[-1]),)
        if key not in cache:
            cache[key] = function(*args)
        return cache[key]
    wrapper.cache = cache
    return wrapper


@_memo
def judge_tasks(looks: tuple[int, ...], n_max: int, final: bool, b: int, c: int, right: int, t: Thresholds) -> str:
    """The task stream's status at one look (the real `_tasks`); `right`: baseline right answers."""
    n = looks[-1]
    out = _Collector()
    cell_right = right - b + c
    entry = schema.TaskCell(reference="auto-sim", max_model_len=0, recovery=cell_right / right if right else None,
                            mcnemar_p=None, n=n, baseline_accuracy=right / n, cell_accuracy=cell_right / n, b=b, c=c,
                            rejected=0, looks=list(looks), n_max=n_max, final=final)
    _tasks(out, CELL, entry, True, None, None, None, t)
    return _status(out)


def _sequential(counts: np.ndarray, looks: list[int], n_max: int, judge) -> tuple[np.ndarray, np.ndarray]:
    """Stop each run at its first decided look. counts: (runs, looks, categories) cumulative."""
    runs = counts.shape[0]
    status = np.empty(runs, dtype=object)
    used = np.empty(runs)
    for i in range(runs):
        for k in range(len(looks)):
            verdict = judge(tuple(looks[:k + 1]), n_max, k == len(looks) - 1, *counts[i, k])
            if verdict != INCONCLUSIVE or k == len(looks) - 1:
                status[i], used[i] = verdict, looks[k]
                break
    return status, used


def _cumulative(rng: np.random.Generator, probs: list[float], looks: list[int], runs: int) -> np.ndarray:
    steps = np.diff([0] + looks)
    parts = np.stack([rng.multinomial(s, probs, size=runs) for s in steps], axis=1)
    return np.cumsum(parts, axis=1)


def simulate_tasks(rng: np.random.Generator, design: Design, accuracy: float, recovery: float, runs: int,
                   t: Thresholds) -> dict:
    c = TASK_DELTA
    b = TASK_DELTA + (1 - recovery) * accuracy
    probs = [accuracy - b, b, c, 1 - accuracy - c]      # both right, only baseline, only cell, neither
    looks = schedule(design.task_first, design.n_max)
    cum = _cumulative(rng, probs, looks, runs)
    counts = np.stack([cum[..., 1], cum[..., 2], cum[..., 0] + cum[..., 1]], axis=-1)   # b, c, baseline right

    def judge(looks_, n_max, final, b_, c_, right):
        return judge_tasks(looks_, n_max, final, int(b_), int(c_), int(right), t)

    status, used = _sequential(counts, looks, design.n_max, judge)
    return {"status": status, "used": used, "looks": looks}


# --- degeneration ----------------------------------------------------------------------------------

@_memo
def judge_degeneration(looks: tuple[int, ...], n_max: int, final: bool, new: int, base_only: int, both: int,
                       t: Thresholds) -> str:
    n = looks[-1]
    out = _Collector()
    entry = schema.DegenerationCell(kv_spec="fp8", max_model_len=0, outputs=n, new_degenerate=new, judged_outputs=n,
                                    outputs_with_findings=new + both, detectors={}, token_limit_rate=None,
                                    baseline_only_degenerate=base_only, looks=list(looks), n_max=n_max, final=final)
    _degeneration(out, CELL, entry, t)
    return _status(out)


def loop_probabilities(auto: float, cell: float, rho: float = LOOP_RHO) -> list[float]:
    """(both, only the cell, only the baseline, neither) with correlation rho, kept a valid table."""
    both = auto * cell + rho * math.sqrt(auto * (1 - auto) * cell * (1 - cell))
    both = min(both, auto, cell)
    return [both, cell - both, auto - both, 1 - auto - cell + both]


def simulate_degeneration(rng: np.random.Generator, design: Design, auto: float, cell: float, runs: int,
                          t: Thresholds) -> dict:
    looks = schedule(design.probe_first, design.n_max, MIN_PROBE_ROUND)
    cum = _cumulative(rng, loop_probabilities(auto, cell), looks, runs)
    counts = np.stack([cum[..., 1], cum[..., 2], cum[..., 0]], axis=-1)    # new, baseline only, both

    def judge(looks_, n_max, final, new, base_only, both):
        return judge_degeneration(looks_, n_max, final, int(new), int(base_only), int(both), t)

    status, used = _sequential(counts, looks, design.n_max, judge)
    return {"status": status, "used": used, "looks": looks}


# --- scenarios -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    kl: tuple[float, ...]            # true KL mean (the late KL follows at the profile's late/mean ratio)
    recovery: float
    loops: tuple[tuple[float, float], ...]   # (auto, cell) loop rates
    wants: str                       # what the scenario measures


PROFILE_NAMES = ("cpu", "cpu-amx", "gpu")
# Healthy KL means measured per profile (kveval/gate/thresholds.py): CPU without AMX SmolLM2 0.018, Gemma-3 0.028;
# CPU with AMX SmolLM2 0.027-0.049; GPU (FA3, H100 at 8192) Qwen2.5 with layers 0, 1 kept 0.008, Gemma-3 0.016,
# SmolLM2 0.024. Each healthy setting draws its true KL from these, in turn.
HEALTHY_KL = {"cpu": (0.018, 0.028), "cpu-amx": (0.027, 0.049), "gpu": (0.008, 0.016, 0.024)}


def scenarios(profile: str, t: Thresholds) -> list[Scenario]:
    budget = t.budget(profile)
    healthy_kl = HEALTHY_KL[profile]
    return [
        Scenario("healthy", healthy_kl, 1.0, ((0.05, 0.05), (0.15, 0.15)), "PASS"),
        Scenario("at PASS margin", (budget.kl_mean_max,), t.task_noninferiority_margin,
                 ((0.05, 0.05 + t.degeneration_noninferiority_margin), (0.15, 0.15 + t.degeneration_noninferiority_margin)),
                 "false PASS"),
        Scenario("at harm bar", (budget.kl_mean_fail,), t.task_recovery_min,
                 ((0.05, 0.05 + t.max_new_degenerate_share), (0.15, 0.15 + t.max_new_degenerate_share)),
                 "false FAIL"),
        Scenario("moderate harm", (2 * budget.kl_mean_max,), 0.85, ((0.05, 0.15), (0.15, 0.25)), "FAIL"),
        Scenario("gross harm", (0.4,), 0.5, ((0.05, 0.30), (0.15, 0.40)), "FAIL"),
    ]


ACCURACIES = (0.6, 0.8)


def rates(status: np.ndarray) -> dict[str, tuple[float, float]]:
    runs = len(status)
    out = {}
    for outcome in OUTCOMES:
        p = float(np.mean(status == outcome))
        out[outcome] = (p, math.sqrt(max(p * (1 - p), 0.25 / runs) / runs))   # floor: SE of 0.5 events
    return out


def combine(*streams: np.ndarray) -> np.ndarray:
    fail = np.any([s == FAIL for s in streams], axis=0)
    passed = np.all([s == PASS for s in streams], axis=0)
    return np.where(fail, FAIL, np.where(passed, PASS, INCONCLUSIVE))


STREAMS = ("divergence", "tasks", "degeneration")


def run_profile(profile: str, design: Design, runs: int, seed: int, t: Thresholds,
                streams: tuple[str, ...] = STREAMS) -> list[dict]:
    """Every stream of every scenario, then the cells (only when all three streams run); rows of results."""
    rows, kept = [], {}
    budget = t.budget(profile)
    for s_index, scenario in enumerate(scenarios(profile, t)):
        rng = np.random.default_rng([seed, s_index, PROFILE_NAMES.index(profile)])
        div = {kl: simulate_divergence(rng, design, kl, runs, t) for kl in scenario.kl} if "divergence" in streams else {}
        tasks = ({acc: simulate_tasks(rng, design, acc, scenario.recovery, runs, t) for acc in ACCURACIES}
                 if "tasks" in streams else {})
        deg = ({loops: simulate_degeneration(rng, design, *loops, runs, t) for loops in scenario.loops}
               if "degeneration" in streams else {})
        kept[scenario.name] = (div, tasks, deg)
        for kl, result in div.items():
            rows.append({"profile": profile, "scenario": scenario, "stream": "divergence",
                         "setting": f"KL {kl:g} (late {kl * budget.kl_late_max / budget.kl_mean_max:.3g})",
                         "rates": rates(result["status"]), "used": float(result["used"].mean()),
                         "paths": {name: {"PASS": float(np.mean(v == True)), "FAIL": float(np.mean(v == False))}  # noqa: E712
                                   for name, v in result["paths"].items()}, "runs": runs,
                         "looks": result["looks"],
                         "stopped": [float(np.mean(result["stopped"] == k)) for k in range(len(result["looks"]))]})
        for acc, result in tasks.items():
            rows.append({"profile": profile, "scenario": scenario, "stream": "tasks",
                         "setting": f"acc {acc:g}, R {scenario.recovery:g}", "rates": rates(result["status"]),
                         "used": float(result["used"].mean()), "looks": result["looks"], "runs": runs})
        for loops, result in deg.items():
            rows.append({"profile": profile, "scenario": scenario, "stream": "degeneration",
                         "setting": f"loops {loops[0]:.0%} -> {loops[1]:.0%}", "rates": rates(result["status"]),
                         "used": float(result["used"].mean()), "looks": result["looks"], "runs": runs})
        for kl, acc, loops in itertools.product(div, tasks, deg):
            cell = combine(div[kl]["status"], tasks[acc]["status"], deg[loops]["status"])
            rows.append({"profile": profile, "scenario": scenario, "stream": "cell",
                         "setting": f"KL {kl:g}, acc {acc:g}, loops {loops[0]:.0%}->{loops[1]:.0%}",
                         "rates": rates(cell),
                         "used": float(tasks[acc]["used"].mean() + deg[loops]["used"].mean()), "runs": runs})
    if set(streams) == set(STREAMS):
        rows += _one_stream_off(profile, kept, runs)
    return rows


def _one_stream_off(profile: str, kept: dict, runs: int) -> list[dict]:
    """The cell's worst cases: one stream at its PASS margin (or harm bar), the other two healthy (the
    healthy scenario's highest KL, accuracy 0.6, loops 5 %). A false PASS of the cell is then about the
    stream's own, where all three at their margins rarely PASS together."""
    healthy = kept["healthy"]
    picks = [healthy[0][max(healthy[0])], healthy[1][ACCURACIES[0]], healthy[2][next(iter(healthy[2]))]]
    rows = []
    for name in ("at PASS margin", "at harm bar"):
        scenario = scenarios(profile, Thresholds())[["healthy", "at PASS margin", "at harm bar"].index(name)]
        for index, stream in enumerate(STREAMS):
            variants = kept[name][index]
            for key, result in variants.items():
                parts = list(picks)
                parts[index] = result
                label = {0: lambda k: f"KL {k:g}", 1: lambda k: f"acc {k:g}",
                         2: lambda k: f"loops {k[0]:.0%}->{k[1]:.0%}"}[index](key)
                rows.append({"profile": profile, "scenario": scenario, "stream": "cell",
                             "setting": f"only {stream[:4]}. here: {label}",
                             "rates": rates(combine(*(p["status"] for p in parts))),
                             "used": float(parts[1]["used"].mean() + parts[2]["used"].mean()), "runs": runs})
    return rows


# --- output ----------------------------------------------------------------------------------------

def _fmt(rate: tuple[float, float]) -> str:
    return f"{100 * rate[0]:5.1f} ± {100 * rate[1]:3.1f}"


def print_rows(rows: list[dict], out=sys.stdout) -> None:
    header = (f"| {'scenario':15} | {'stream':12} | {'setting':34} | {'PASS %':>11} | {'FAIL %':>11} | "
              f"{'INCONCL %':>11} | {'mean used':>9} |")
    print(header, file=out)
    print("|" + "|".join("-" * (len(part)) for part in header.split("|")[1:-1]) + "|", file=out)
    for row in rows:
        used = {"divergence": "docs", "tasks": "samples", "degeneration": "outputs", "cell": "smp+outs"}[row["stream"]]
        r = row["rates"]
        print(f"| {row['scenario'].name:15} | {row['stream']:12} | {row['setting']:34} | {_fmt(r[PASS]):>11} | "
              f"{_fmt(r[FAIL]):>11} | {_fmt(r[INCONCLUSIVE]):>11} | {row['used']:5.0f} {used:<3} |".replace(" <3", ""),
              file=out)


def print_paths(rows: list[dict], out=sys.stdout) -> None:
    """The divergence stream's two FAIL paths and its PASS parts, each on its own."""
    print("\nDivergence per check (share of runs where the check PASSed / FAILed on its own, at the look the "
          "stream stopped at), and the share of runs stopping at each look (sequences scored):", file=out)
    for row in rows:
        if row["stream"] != "divergence":
            continue
        parts = ", ".join(f"{name} {100 * v['PASS']:.1f} / {100 * v['FAIL']:.1f}" for name, v in row["paths"].items())
        stops = " / ".join(f"{100 * share:.1f}" for share in row["stopped"])
        print(f"  {row['profile']} {row['scenario'].name:15} {row['setting']:28} {parts}; stopped at "
              f"{' / '.join(str(n) for n in row['looks'])}: {stops} %", file=out)


def check_targets(rows: list[dict], t: Thresholds) -> list[str]:
    """The done-when targets, each with its figure and whether it holds (3 Monte Carlo SE allowance noted)."""
    lines = []
    for row in rows:
        name, stream, profile = row["scenario"].name, row["stream"], row["profile"]
        p, se = row["rates"][PASS]
        f, fse = row["rates"][FAIL]
        where = f"{profile} {name} {stream} [{row['setting']}]"
        if name == "at PASS margin":
            lines.append(_target(where, "false PASS", p, se, "<=", t.alpha))
        if name == "at harm bar":
            limit = t.alpha if stream == "cell" else (2 * t.fail_alpha if stream == "divergence" else t.fail_alpha)
            lines.append(_target(where, "false FAIL", f, fse, "<=", limit))
        if name == "healthy" and stream == "cell":
            lines.append(_target(where, "healthy PASS", p, se, ">=", 0.9 if profile == "gpu" else 0.8))
        if name == "moderate harm" and stream == "cell":
            lines.append(_target(where, "moderate-harm FAIL", f, fse, ">=", 0.8))
    return lines


def _target(where: str, what: str, value: float, se: float, op: str, limit: float) -> str:
    holds = value <= limit if op == "<=" else value >= limit
    within = abs(value - limit) <= 3 * se
    mark = "holds" if holds else ("within 3 SE" if within else "MISSED")
    return f"{mark:12} {what} {100 * value:.1f} % (SE {100 * se:.1f}) {op} {100 * limit:g} %  {where}"


def _design_words(design: Design) -> str:
    looks = design.divergence_looks()
    extra = looks[-1] - looks[0]
    if not design.documents_max:
        return "no scoring rounds"
    return (f"{design.documents} -> {design.documents + extra} documents, N_max {design.documents_max}, "
            f"the last look final")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000, help="simulated cells per scenario and setting (4000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", choices=(*PROFILE_NAMES, "all"), default="all")
    parser.add_argument("--documents", type=int, default=None,
                        help="teacher-forced documents per cell (default: CPU 12, GPU 24)")
    parser.add_argument("--budget", type=int, default=None,
                        help="paired samples / judged outputs per cell (default: kveval's, 600 CPU / 1200 GPU)")
    parser.add_argument("--cv", type=float, default=0.5, help="between-sequence CV of the KL means (0.5)")
    parser.add_argument("--documents-max", type=int, default=MAX_SCORED_SEQUENCES,
                        help=f"the divergence design's N_max in scored sequences per cell ({MAX_SCORED_SEQUENCES}; "
                             "0: no scoring rounds, one fixed-sample look)")
    parser.add_argument("--alpha", type=float, default=None, help="the gate's alpha (default 0.05)")
    parser.add_argument("--streams", default=",".join(STREAMS),
                        help="comma-separated streams to simulate (cells only with all three)")
    args = parser.parse_args(argv)
    t = Thresholds() if args.alpha is None else Thresholds(alpha=args.alpha)
    documents = None if args.documents is None else {name: args.documents for name in PROFILE_NAMES}
    designs = default_designs(documents, args.budget, args.cv, args.documents_max)
    profiles = PROFILE_NAMES if args.profile == "all" else (args.profile,)
    streams = tuple(x.strip() for x in args.streams.split(",") if x.strip())
    if not set(streams) <= set(STREAMS):
        parser.error(f"--streams: choose from {', '.join(STREAMS)}")
    all_rows = []
    for profile in profiles:
        started = time.perf_counter()
        design = designs[profile]
        n, late = design.sequences()
        rows = run_profile(profile, design, args.runs, args.seed, t, streams)
        budget = t.budget(profile)
        print(f"\n## {profile.upper()} profile: KL budget {budget.kl_mean_max:g} / harm {budget.kl_mean_fail:g}, late "
              f"{budget.kl_late_max:g} / {budget.kl_late_fail:g}, top-1 >= {budget.top1_agreement_min:g}; "
              f"{design.documents} documents + {len(CONTINUATIONS[profile])} continuations at {design.max_model_len} "
              f"({int(n.sum())} positions, {int(late.sum())} late), CV {design.cv:g}; divergence looks "
              f"{design.divergence_looks()} sequences ({_design_words(design)}); task looks "
              f"{schedule(design.task_first, design.n_max)}, probe looks "
              f"{schedule(design.probe_first, design.n_max, MIN_PROBE_ROUND)}; alpha {t.alpha:g}, FAIL paths at "
              f"{t.fail_alpha:g}; {args.runs} runs per row, seed {args.seed}\n")
        print_rows(rows)
        print_paths(rows)
        print(f"\n({profile}: {time.perf_counter() - started:.0f} s)")
        all_rows += rows
    print("\nTargets:")
    for line in check_targets(all_rows, t):
        print("  " + line)


if __name__ == "__main__":
    main()
