"""kveval against the pipeline a competent user would script, same coverage, side by side (prints figures).

    .venv/bin/python scripts/bench_vs_naive.py [--out DIR] [-- KVEVAL COMPARE ARGS...]   (= make bench)
    .venv/bin/python scripts/bench_vs_naive.py --show DIR     # print a finished bench's figures again

1. `kveval compare` (default DEMO_ARGS, `make demo`'s matrix: fp8 and auto at 1024 on the embedded
   model, 40 MiB KV budget, quick suite, tasks passkey and niah_single; `--enforce-eager` only where no NVIDIA GPU
   is seen: on CUDA the default stays CUDA graphs), always with SAME_COVERAGE (no K/V range pass, no
   remedy: the naive pipeline has no counterpart for them).
2. The naive pipeline (scripts/naive_pipeline.py) on the same cells and the same inputs (the prompts,
   scoring documents and task data kveval wrote, kveval's task rounds folded in): per cell one batched
   generation script, one batched teacher-forced scoring script, stock `lm_eval --model vllm` and one speed
   script (concurrency 1, then the throughput levels), each a process with its own engine. A job whose
   engine does not start (FP8 on an AVX2-only CPU) fails as it would for the user, who then skips that
   cell's other jobs.

Prints, with the machine they were measured on:
- both wall times and the ratio kveval / naive (goal <= 0.4);
- kveval's own overhead: wall - (engine start-up + time inside engine calls), split into the parent's
  work, the cell processes' time outside their phases (Python, torch and vLLM import, exit) and the
  phases' own work outside engine calls (goal <= 5 % on a GPU, <= 10 % on a CPU);
- per cell and phase, the engine efficiency kveval measured: the phase's tokens per second inside engine
  calls against a single batched call of a sample of the same requests on the same engine (goal >= 80 %).
Cell files without the issue-18 fields (engine_seconds, efficiency) print "n/a"; the overhead then falls
back to phase seconds, and says so. The figures assume one cell at a time (no --gpus).
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from naive_pipeline import base_cells, jobs_for, tasks_command  # noqa: E402

# `make demo`'s matrix: about 7 min for kveval on 2 cores, so the whole bench fits a quarter hour.
DEMO_ARGS = ["--kv", "fp8", "auto", "--max-model-len", "1024", "--kv-cache-memory", "40MiB",
             "--suite", "quick", "--tasks", "passkey", "niah_single", "--enforce-eager"]
SAME_COVERAGE = ["--no-diagnose", "--remedy", "off"]
EFFICIENCY_PHASES = ("generation", "scoring", "tasks")
GOALS = {"ratio": 0.4, "overhead_gpu": 0.05, "overhead_cpu": 0.10, "efficiency": 0.80}


def nvidia_gpus() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listed.splitlines() if line.startswith("GPU")]


def default_args() -> list[str]:
    return [a for a in DEMO_ARGS if a != "--enforce-eager"] if nvidia_gpus() else list(DEMO_ARGS)


def machine(manifest: dict | None) -> dict:
    """CPU model, cores, AVX-512/AMX flags and GPUs: from the run's manifest, completed from this host."""
    hardware = (manifest or {}).get("hardware") or {}
    flags: set[str] = set(hardware.get("cpu_flags") or [])
    cpu = hardware.get("cpu")
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and ":" in line:
                flags |= set(line.split(":", 1)[1].split())
            elif line.startswith("model name") and ":" in line and not cpu:
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wide = sorted(f for f in flags if f.startswith(("avx512", "amx")))
    return {"cpu": cpu or platform.processor(), "cores": hardware.get("cores"),
            "avx512_amx": wide, "avx2": "avx2" in flags, "gpus": hardware.get("gpus") or nvidia_gpus(),
            "vllm": ((manifest or {}).get("versions") or {}).get("vllm"),
            "vllm_distribution": ((manifest or {}).get("versions") or {}).get("vllm_distribution")}


def machine_line(m: dict) -> str:
    if m["gpus"]:
        where = "; ".join(m["gpus"])
    else:
        wide = ("AVX-512/AMX: " + " ".join(m["avx512_amx"])) if m["avx512_amx"] else (
            "AVX2 only, no AVX-512" if m["avx2"] else "no AVX2")
        where = f"{m['cpu']}, {m['cores']} cores, {wide}"
    return f"{where}; vLLM {m['vllm']} ({m['vllm_distribution']})"


# --- kveval's side -------------------------------------------------------------------------------

def run_kveval(args: list[str], out: Path) -> float:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kveval", "compare", *args, *SAME_COVERAGE, "--out", str(out)])
    if done.returncode not in (0, 1, 3, 4):  # the verdict's codes all mean "review written"
        raise SystemExit(f"kveval compare exited {done.returncode}")
    return time.perf_counter() - began


WARM_UP_SETS = ("--phases", "--tasks", "--budget", "--out")   # the warm-up's own values replace the user's


def _without(args: list[str], options: tuple[str, ...]) -> list[str]:
    """`args` less each of `options` (as `--opt v ...` or `--opt=v`) and its values (up to the next option)."""
    out, skipping = [], False
    for arg in args:
        if arg.startswith("--"):
            skipping = arg.split("=", 1)[0] in options
            if skipping:
                continue
        elif skipping:
            continue
        out.append(arg)
    return out


def warm_up(args: list[str], out: Path) -> dict:
    """One short kveval run of the same cells (speed phase only) before either clock starts: vLLM caches
    its torch.compile artifacts and CUDA-graph shapes on disk per engine configuration, so whichever side
    ran first would pay the compilation (~30 s per configuration on the H200) and the other get it cached.
    After this both start warm, as on a serving host that has run the model before. Best effort: a failure
    is reported and the bench goes on."""
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kveval", "compare", *_without(args, WARM_UP_SETS), *SAME_COVERAGE,
                           "--phases", "speed",
                           "--tasks", "none", "--budget", "0", "--out", str(out)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return {"seconds": round(time.perf_counter() - began, 1), "exit": done.returncode}


def _num(value) -> float:
    return float(value) if isinstance(value, (int, float)) else 0.0


def cell_records(run: Path) -> list[dict]:
    """Every cell process kveval ran: cells/<cell>.json and the rounds' cells/<cell>.tasks-r<k>.json
    (read as plain JSON: the issue-18 fields may be absent)."""
    records = []
    for path in sorted((run / "cells").glob("*.json")):
        if path.name.endswith(".spec.json"):
            continue
        try:
            cell = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(cell, dict) and "phases" in cell:
            records.append({**cell, "cell": path.name[: -len(".json")]})   # a round's id is its file's
    return records


PARENT_STEPS = {"looks": "looks at the evidence (read and judge every cell file)",
                "round_data": "rounds' new task data and probes",
                "cell_files": "around cell processes (spec, hand-over, read file)"}


def kveval_split(run: Path, wall: float) -> dict:
    """Engine start-up + time inside engine calls, and the rest: the parent, the cell processes outside
    their phases, and the phases' own work outside engine calls."""
    startup = engine_calls = references = warmups = processes = phases_total = 0.0
    missing_engine: list[str] = []
    cells, warm, forked = [], 0, 0
    for cell in cell_records(run):
        process = cell.get("process") or {}
        seconds = _num(process.get("seconds"))
        forked += bool(process.get("forked"))
        warm += bool(process.get("warm")) and not process.get("forked")
        own_startup = _num(cell.get("startup_seconds"))
        own_phases = own_engine = 0.0
        rows = {}
        for name, phase in (cell.get("phases") or {}).items():
            phase = phase or {}
            phase_seconds = _num(phase.get("seconds"))
            inside = phase.get("engine_seconds")
            if not isinstance(inside, (int, float)):
                missing_engine.append(f"{cell['cell']}/{name}")
                inside = phase_seconds   # best available: the phase's whole time
            own_phases += phase_seconds
            own_engine += float(inside)
            # The efficiency reference is engine work too, run behind the phase's clock (worker/efficiency.py).
            eff = phase.get("efficiency")
            reference = _num(eff.get("reference_seconds")) if isinstance(eff, dict) else 0.0
            own_engine += reference
            references += reference
            # The scoring phase's warm-up call, also outside its clock (worker/phases/scoring._warm_up).
            warmup = _num(phase.get("warmup_seconds"))
            own_engine += warmup
            warmups += warmup
            rows[name] = {"seconds": phase_seconds, "engine_seconds": phase.get("engine_seconds"),
                          "efficiency": phase.get("efficiency")}
        startup += own_startup
        engine_calls += own_engine
        phases_total += own_phases
        processes += seconds
        cells.append({"cell": cell["cell"], "started": cell.get("started"), "process_seconds": seconds,
                      "warm": process.get("warm"), "forked": process.get("forked"), "startup_seconds": own_startup,
                      "phases": rows})
    engine = startup + engine_calls
    overhead = max(0.0, wall - engine)
    in_phases = max(0.0, phases_total - engine_calls)
    process_other = max(0.0, processes - startup - phases_total)
    parent = max(0.0, overhead - in_phases - process_other)
    return {"parent_parts": parent_parts(run, wall, processes), "wall": wall, "engine": engine, "startup": startup, "engine_calls": engine_calls, "references": references, "warmups": warmups,
            "overhead": overhead, "parent": parent, "process_other": process_other, "in_phases": in_phases,
            "processes": len(cells), "warm_processes": warm, "forked_processes": forked,
            "missing_engine_seconds": missing_engine,
            "cells": cells}


def parent_parts(run: Path, wall: float, processes: float) -> dict:
    """The parent's time by part, from the manifest's timing (run/compare.py, run/parent_clock.py): set-up,
    the K/V pass, between cells by step, and outside the run's clock (CLI start-up, the review and figures)."""
    try:
        timing = json.loads((run / "manifest.json").read_text()).get("timing") or {}
    except (OSError, ValueError):
        return {}
    run_seconds = timing.get("run_seconds")
    if not isinstance(run_seconds, (int, float)):
        return {}
    setup, diagnosis = _num(timing.get("setup_seconds")), _num(timing.get("diagnosis_seconds"))
    between = max(0.0, run_seconds - setup - diagnosis - processes)
    steps = {name: _num((step or {}).get("seconds")) for name, step in (timing.get("steps") or {}).items()}
    return {"setup": setup, "diagnosis": diagnosis, "between": between, "steps": steps,
            "between_rest": max(0.0, between - sum(steps.values())), "outside_run": max(0.0, wall - run_seconds)}


def efficiency_rows(split: dict) -> dict[str, dict]:
    """Per phase: each cell's ratio and the token-weighted whole (sum of tokens over engine seconds,
    against the same sum of the references)."""
    out = {}
    for name in EFFICIENCY_PHASES:
        per_cell, tokens, seconds, ref_tokens, ref_seconds = [], 0.0, 0.0, 0.0, 0.0
        for cell in split["cells"]:
            phase = cell["phases"].get(name)
            if phase is None:
                continue
            eff = phase.get("efficiency")
            if isinstance(eff, dict) and isinstance(eff.get("ratio"), (int, float)):
                per_cell.append({"cell": cell["cell"], **eff})
                tokens += _num(eff.get("tokens"))
                seconds += _num(eff.get("engine_seconds"))
                ref_tokens += _num(eff.get("reference_tokens"))
                ref_seconds += _num(eff.get("reference_seconds"))
            else:
                per_cell.append({"cell": cell["cell"], "ratio": None})
        whole = None
        if tokens and seconds and ref_tokens and ref_seconds:
            whole = (tokens / seconds) / (ref_tokens / ref_seconds)
        out[name] = {"cells": per_cell, "whole": whole}
    return out


def kveval_coverage(run: Path) -> dict[str, dict]:
    """Per base cell: prompts generated, sequences scored (noise re-scores apart), task samples."""
    cover: dict[str, dict] = {}
    for cell in cell_records(run):
        base = cell["cell"].split(".tasks-r")[0]
        row = cover.setdefault(base, {"generated": 0, "scored": 0, "noise": 0, "task_samples": 0})
        phases = cell.get("phases") or {}
        generation = phases.get("generation") or {}
        row["generated"] += sum(1 for r in generation.get("records") or [] if r.get("accepted"))
        scoring = phases.get("scoring") or {}
        row["scored"] += sum(1 for s in scoring.get("sequences") or [] if s.get("accepted"))
        row["noise"] += sum(1 for s in ((scoring.get("noise") or {}).get("sequences") or []) if s.get("accepted"))
        row["task_samples"] += len((phases.get("tasks") or {}).get("samples") or [])
    return cover


# --- the naive side ------------------------------------------------------------------------------

def run_naive(run: Path, out: Path, only: str | None = None) -> tuple[float, list[dict]]:
    """Every naive job of every cell in turn (`only`: that job alone, for --redo-naive)."""
    script = Path(__file__).resolve().with_name("naive_pipeline.py")
    rows = []
    # Built before the clock starts (a merged task data directory where kveval ran task rounds).
    lm_eval = {cell: tasks_command(sys.executable, run, cell, out) for cell in base_cells(run)
               if "tasks" in jobs_for(run, cell) and only in (None, "tasks")}
    began = time.perf_counter()
    for cell in base_cells(run):
        first_failed = None
        for job in [j for j in jobs_for(run, cell) if only in (None, j)]:
            if first_failed is not None:
                # The cell's first script failed (its engine did not start, e.g. FP8 on an AVX2-only CPU):
                # a user sees that and does not run the others.
                print(f"  naive {cell:<22} {job:<9} skipped: the cell's first job failed", flush=True)
                rows.append({"cell": cell, "job": job, "seconds": 0.0, "exit": first_failed, "skipped": True})
                continue
            command = (lm_eval[cell] if job == "tasks" else
                       [sys.executable, str(script), job, "--cell", cell, "--run", str(run), "--out", str(out)])
            start = time.perf_counter()
            with open(out / f"{job}-{cell}.log", "w") as log:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
            row = {"cell": cell, "job": job, "seconds": time.perf_counter() - start, "exit": code}
            result = out / f"{job}-{cell}.json"
            if job != "tasks" and code == 0 and result.is_file():
                facts = json.loads(result.read_text())
                row.update({k: facts.get(k) for k in ("startup_seconds", "engine_seconds", "tokens", "submitted",
                                                      "scored", "noise_rescored")})
            if job == "tasks":
                row["task_samples"] = sum(sum(1 for line in p.open() if line.strip())
                                          for p in (out / f"lmeval-{cell}").rglob("samples_*.jsonl"))
            rows.append(row)
            if code != 0 and first_failed is None and len([r for r in rows if r["cell"] == cell]) == 1:
                first_failed = code
            inside = (f"start-up {row['startup_seconds']:5.1f} s, engine {row['engine_seconds']:6.1f} s"
                      if row.get("engine_seconds") is not None else "")
            print(f"  naive {cell:<22} {job:<9} {row['seconds']:7.1f} s  exit {code}  {inside}", flush=True)
    return time.perf_counter() - began, rows


# --- printing ------------------------------------------------------------------------------------

def _pct(value) -> str:
    return f"{100 * value:5.1f} %" if isinstance(value, (int, float)) else "  n/a"


def _met(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "NOT met")


def show(bench: dict) -> None:
    m, split, rows = bench["machine"], bench["kveval"], bench["naive"]
    kveval_wall, naive_wall = bench["kveval_wall"], bench["naive_wall"]
    gpu = bool(m["gpus"])
    print(f"\nMachine: {machine_line(m)}")
    warmed = bench.get("warm_up")
    if warmed:
        print(f"warm-up before both clocks (same cells, speed phase only: vLLM's compile cache): "
              f"{warmed['seconds']} s, exit {warmed['exit']}")
    print(f"kveval compare {' '.join(bench['compare_args'] + SAME_COVERAGE)}")
    for entry in bench.get("redone") or []:
        print(f"naive {entry['cell']}/{entry['job']} redone with --redo-naive: {entry['before']['seconds']:.1f} s "
              f"exit {entry['before']['exit']} -> {entry['after']['seconds']:.1f} s exit {entry['after']['exit']}")
    forked = f", {split['forked_processes']} forked" if split.get("forked_processes") else ""
    print(f"{split['processes']} kveval cell processes ({split['warm_processes']} started warm{forked}); "
          f"{sum(1 for r in rows if not r.get('skipped'))} naive processes, one engine each\n")

    ratio = kveval_wall / naive_wall if naive_wall else None
    print("Wall time, side by side")
    print(f"  kveval compare     {kveval_wall:8.1f} s")
    if bench.get("naive_skipped"):
        print("  naive pipeline     not run (--skip-naive): no ratio; the overhead and efficiency below are kveval's own")
    else:
        print(f"  naive pipeline     {naive_wall:8.1f} s")
        print(f"  ratio              {ratio:8.2f}x  (goal <= {GOALS['ratio']}: {_met(ratio <= GOALS['ratio'])})"
              if ratio is not None else "  ratio                   n/a")

    goal = GOALS["overhead_gpu" if gpu else "overhead_cpu"]
    share = split["overhead"] / kveval_wall if kveval_wall else None
    print("\nkveval's own overhead = wall - (engine start-up + time inside engine calls)")
    print(f"  engine start-up                             {split['startup']:8.1f} s")
    print(f"  inside engine calls                         {split['engine_calls']:8.1f} s"
          f"  (of which efficiency references {split.get('references', 0.0):.1f} s"
          + (f", scoring warm-ups {split['warmups']:.1f} s" if split.get("warmups") else "") + ")")
    print(f"  overhead                                    {split['overhead']:8.1f} s = {_pct(share)} of wall "
          f"(goal <= {100 * goal:.0f} % on a {'GPU' if gpu else 'CPU'}: {_met(share <= goal if share is not None else None)})")
    print(f"    parent (model check, prompts, task data, planning, report)  {split['parent']:7.1f} s")
    parts = split.get("parent_parts") or {}
    if parts:
        print(f"      set-up (model, tokenising, planning, task data)           {parts['setup']:7.1f} s")
        if parts["diagnosis"]:
            print(f"      K/V range pass                                            {parts['diagnosis']:7.1f} s")
        print(f"      between cells                                             {parts['between']:7.1f} s")
        for name, seconds in parts["steps"].items():
            print(f"        {PARENT_STEPS.get(name, name):<56}{seconds:7.1f} s")
        if parts["steps"]:
            print(f"        {'the rest':<56}{parts['between_rest']:7.1f} s")
        print(f"      outside the run's clock (CLI start-up, review, figures)   {parts['outside_run']:7.1f} s")
    print(f"    cell processes outside phases (imports, engine exit)        {split['process_other']:7.1f} s")
    print(f"    phases outside engine calls (kveval's own work in a cell)   {split['in_phases']:7.1f} s")
    if split["engine"] > kveval_wall:
        print("  engine time exceeds the wall time: cells ran side by side (--gpus), so this split does not apply")
    if split["missing_engine_seconds"]:
        print(f"  n/a: no engine_seconds in {len(split['missing_engine_seconds'])} phase records "
              f"(e.g. {split['missing_engine_seconds'][0]}); their whole phase time is counted as engine time, "
              f"so the overhead above is a lower bound")
    if split["warm_processes"]:
        print("  (a warm process's seconds start at its hand-over: its imports, done while the previous cell "
              "ran, are in no one's time)")
    if split.get("forked_processes"):
        print("  (a forked process's seconds start at its hand-over: the fork server's imports, done beside the "
              "set-up, are in no one's time; a first cell that waits for them has the wait in its own)")

    print("\nEngine efficiency: phase tokens/s inside engine calls vs one batched call of a sample of the same "
          f"requests on the same engine (goal >= {100 * GOALS['efficiency']:.0f} %)")
    efficiency = bench["efficiency"]
    cells = [c["cell"] for c in split["cells"]]
    print(f"  {'cell':<28}" + "".join(f"{p:>12}" for p in EFFICIENCY_PHASES))
    for cell in cells:
        values = []
        for phase in EFFICIENCY_PHASES:
            entry = next((e for e in efficiency[phase]["cells"] if e["cell"] == cell), None)
            values.append("-" if entry is None else _pct(entry.get("ratio")))
        print(f"  {cell:<28}" + "".join(f"{v:>12}" for v in values))
    wholes = [efficiency[p]["whole"] for p in EFFICIENCY_PHASES]
    print(f"  {'all cells (token-weighted)':<28}" + "".join(f"{_pct(w):>12}" for w in wholes))
    print("  goal: " + ", ".join(f"{p} {_met(w >= GOALS['efficiency'] if w is not None else None)}"
                                 for p, w in zip(EFFICIENCY_PHASES, wholes)))
    methods = sorted({e.get("method") for p in EFFICIENCY_PHASES for e in efficiency[p]["cells"] if e.get("method")})
    for method in methods:
        print(f"  method: {method}")

    print("\nCoverage per cell: kveval | naive (generated prompts; scored sequences + noise re-scores; task samples)")
    cover = bench["coverage"]
    for cell, row in cover.items():
        naive = {r["job"]: r for r in rows if r["cell"] == cell}
        gen = naive.get("generate", {}).get("submitted")
        scored = naive.get("score", {}).get("scored")
        noise = naive.get("score", {}).get("noise_rescored")
        tasks = naive.get("tasks", {}).get("task_samples")
        print(f"  {cell:<24} {row['generated']:>4} | {gen if gen is not None else 'n/a':>4}   "
              f"{row['scored']:>3}+{row['noise']:<3} | {scored if scored is not None else 'n/a'}+{noise if noise is not None else 'n/a'}"
              f"   {row['task_samples']:>4} | {tasks if tasks is not None else 'n/a'}")
    failed = [f"{r['cell']}/{r['job']} ({'skipped' if r.get('skipped') else 'exit %s' % r['exit']})"
              for r in rows if r["exit"] != 0]
    if failed:
        print(f"  naive jobs that failed (logs: naive/<job>-<cell>.log beside bench.json): {', '.join(failed)}")
    print("\nNaive pipeline per job, all cells: wall (engine start-up + inside engine calls; lm_eval's are in its wall)")
    for job in ("generate", "score", "tasks", "speed"):
        mine = [r for r in rows if r["job"] == job and not r.get("skipped")]
        if not mine:
            continue
        inside = (f"  ({sum(_num(r.get('startup_seconds')) for r in mine):.1f} s + "
                  f"{sum(_num(r.get('engine_seconds')) for r in mine):.1f} s)" if job != "tasks" else "")
        print(f"  {job:<9} {len(mine)} processes {sum(r['seconds'] for r in mine):8.1f} s{inside}")


def redo_naive(out: Path, job: str) -> None:
    """Re-run `job` for every cell, replace its rows in bench.json and move the naive wall time (the jobs
    ran one after another, so their walls add up) by the difference; bench.json says what was redone."""
    bench = json.loads((out / "bench.json").read_text())
    _, fresh = run_naive(out / "kveval", out / "naive", only=job)
    rows = bench["naive"]
    for new in fresh:
        index = next(i for i, row in enumerate(rows) if row["cell"] == new["cell"] and row["job"] == job)
        old = rows[index]
        bench["naive_wall"] += new["seconds"] - old["seconds"]
        bench.setdefault("redone", []).append({"cell": new["cell"], "job": job, "before": old, "after": new})
        rows[index] = new
    bench["ratio"] = bench["kveval_wall"] / bench["naive_wall"] if bench["naive_wall"] else None
    (out / "bench.json").write_text(json.dumps(bench, indent=1))
    show(bench)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where both runs go (default: a temporary directory)")
    parser.add_argument("--show", type=Path, default=None, help="print a finished bench's figures (its --out)")
    parser.add_argument("compare_args", nargs="*", help="kveval compare arguments, after -- (default: DEMO_ARGS)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="skip the warm-up run that fills vLLM's compile cache for both sides (see warm_up)")
    parser.add_argument("--redo-naive", metavar="JOB", choices=("generate", "score", "tasks", "speed"),
                        help="re-run one naive job for every cell of the finished bench in --out and rewrite its "
                             "bench.json (the naive wall time changes by the jobs' difference): for a job that failed "
                             "for a reason outside the comparison, e.g. a file missing on the machine")
    parser.add_argument("--skip-naive", action="store_true",
                        help="run kveval only: its overhead and efficiency, without the naive side (no ratio); for "
                             "re-measuring kveval's own figures after a change where the naive side did not change")
    args = parser.parse_args()
    if args.redo_naive:
        if args.out is None or not (args.out / "bench.json").is_file():
            raise SystemExit("--redo-naive needs --out with a finished bench (its bench.json)")
        redo_naive(args.out, args.redo_naive)
        return 0
    if args.show is not None:
        show(json.loads((args.show / "bench.json").read_text()))
        return 0
    out = args.out or Path(tempfile.mkdtemp(prefix="kveval-bench-"))
    if out.is_dir() and any(out.iterdir()) and not ((out / "kveval").exists() or (out / "naive").exists()):
        raise SystemExit(f"{out} holds other files: give a new --out (a bench's own --out is redone)")
    shutil.rmtree(out, ignore_errors=True)
    (out / "naive").mkdir(parents=True)
    compare_args = args.compare_args or default_args()
    if not any(a == "--model" or a.startswith("--model=") for a in compare_args):   # the embedded model, converted once, outside both timings
        subprocess.run([sys.executable, "-m", "kveval", "models", "--prepare"], check=True)

    warmed = None if args.no_warm_up else warm_up(compare_args, out / "warm-up")
    if warmed is not None:
        print(f"warm-up (same cells, speed phase only; outside both clocks): {warmed['seconds']} s, "
              f"exit {warmed['exit']}", flush=True)
    print(f"kveval compare {' '.join(compare_args + SAME_COVERAGE)}", flush=True)
    kveval_wall = run_kveval(compare_args, out / "kveval")
    run = out / "kveval"
    split = kveval_split(run, kveval_wall)
    if args.skip_naive:
        naive_wall, rows = 0.0, []
    else:
        print("\nNaive pipeline, one process and one engine per job:", flush=True)
        naive_wall, rows = run_naive(run, out / "naive")
    manifest = json.loads((run / "manifest.json").read_text())
    bench = {"compare_args": compare_args, "warm_up": warmed, "machine": machine(manifest), "kveval_wall": kveval_wall,
             "naive_skipped": args.skip_naive,
             "naive_wall": naive_wall, "ratio": kveval_wall / naive_wall if naive_wall else None,
             "kveval": split, "efficiency": efficiency_rows(split), "coverage": kveval_coverage(run), "naive": rows}
    (out / "bench.json").write_text(json.dumps(bench, indent=1))
    show(bench)
    print(f"\nBoth runs and bench.json: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
