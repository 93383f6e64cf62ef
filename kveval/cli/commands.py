"""The `kveval` command: a thin click shell over kveval.api. User errors print one clean line.

Exit codes (kveval.gate.decision): 0 deployable as asked (PASS), 1 no tested FP8 configuration is deployable
(FAIL), 2 usage error or unusable input, 3 undecided (INCONCLUSIVE), 4 what was asked does not pass but a
configuration kveval tested does (kveval.api.EXIT_FOUND; 0 with `gate --require any`); 5 `kveval diff`: run B
got worse than run A (kveval.api.EXIT_WORSE); 70 an internal error of kveval (never read as a verdict); 130
when a compare is interrupted.
"""
from __future__ import annotations

import dataclasses
import shlex
import signal
import sys

import click

from kveval import __version__
from kveval.cli.options import (MultiValueOption, parse_float_list, parse_int_list, parse_json_object,
                                 parse_key_value, split_values)
from kveval import defaults
from kveval.api import EXIT_USAGE, REMEDY_MODES, SUITES, Thresholds, run_exit_code

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
EXIT_INTERRUPTED = 130


class UsageFailure(click.ClickException):
    """A bad input (option value, run directory, thresholds file): one line, exit code 2 (EXIT_USAGE),
    like click's own usage errors, so it never reads as FAIL (1) or INCONCLUSIVE (3)."""

    exit_code = EXIT_USAGE


def _spaced(values) -> str:
    return " ".join(str(v) for v in values)


def gate_options(command):
    """--gate-config and --threshold, shared by compare, report and gate."""
    command = click.option(
        "--threshold", "thresholds", multiple=True, metavar="KEY=VALUE",
        help="Override one gate threshold, e.g. --threshold kl_mean_max=0.01 (repeatable). Keys: "
             + ", ".join(f.name for f in dataclasses.fields(Thresholds)) + ".",
    )(command)
    return click.option("--gate-config", default=None, metavar="FILE.yaml",
                        help="Gate thresholds from a YAML mapping (threshold: value); --threshold wins over it.")(command)


def task_shape_options(default_prefix: str):
    """--task-lengths, --task-depths and --task-samples, shared by compare and tasks generate."""
    def decorate(command):
        command = click.option("--task-samples", type=int, default=None,
                               help=f"Samples per task x size x depth point (default: {default_prefix}1).")(command)
        command = click.option("--task-depths", cls=MultiValueOption, default=None, metavar="SHARE...",
                               help=f"Needle depths in the haystack (default: {default_prefix}{_spaced(defaults.TASK_DEPTHS)}).")(command)
        return click.option("--task-lengths", cls=MultiValueOption, default=None, metavar="SHARE...",
                            help="Task prompt sizes as shares of max_model_len; above 1 probes rejection "
                                 f"(default: {default_prefix}{_spaced(defaults.TASK_LENGTHS)}).")(command)
    return decorate


def task_shape_kwargs(task_lengths, task_depths, task_samples) -> dict:
    """The parsed values of task_shape_options, as keyword arguments of the API."""
    return {"task_lengths": parse_float_list(task_lengths, "--task-lengths"),
            "task_depths": parse_float_list(task_depths, "--task-depths"), "task_samples": task_samples}


def parse_thresholds(items) -> dict[str, str]:
    """("kl_mean_max=0.01", ...) -> {"kl_mean_max": "0.01"}; keys and values are checked by kveval.gate."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value.strip():
            raise UsageFailure(f"--threshold {item!r} is not of the form KEY=VALUE (e.g. kl_mean_max=0.01)")
        overrides[key] = value.strip()
    return overrides


def _decision_text(decision) -> str:
    """The two answers in one line, as the review's verdict lines state them: "FAIL (fp8 as asked); deployable
    FP8 configuration: PASS (fp8:keep=0,1 up to --max-model-len 8192)"."""
    found = (f" ({decision.configuration} up to --max-model-len {decision.max_model_len})"
             if decision.configuration else "")
    asked = " ".join(decision.asked_configurations) or "nothing"
    return f"{decision.asked} ({asked} as asked); deployable FP8 configuration: {decision.deployable}{found}"


def _finish(result) -> None:
    """Print the review's path (stdout, alone: scripts read it), the HTML page to share and the two verdicts
    (stderr), and exit with the run's code."""
    click.echo(str(result.review_path))
    if result.html_path:
        click.echo(f"HTML review: {result.html_path}", err=True)
    code = run_exit_code(result.decision)
    click.echo(f"Verdict: {_decision_text(result.decision)}; exit code {code}", err=True)
    sys.exit(code)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="kveval")
def cli() -> None:
    """May this model run with an FP8 KV cache? Start real vLLM engines and find out."""


# vLLM's own engine options, first class here: passed to every engine, and read by kveval's loaders
# (tokenizer, config, K/V diagnosis) where they say which files vLLM loads (inputs/model_config.ModelSource).
VLLM_OPTIONS = {
    "tensor_parallel_size": ("--tensor-parallel-size", int, "GPUs per engine (tensor parallel)."),
    "dtype": ("--dtype", str, "The model's compute dtype (e.g. bfloat16, float16; default: the checkpoint's)."),
    "tokenizer": ("--tokenizer", str, "Another tokenizer (id or directory) for vLLM and kveval's prompts."),
    "revision": ("--revision", str, "The model revision (branch, tag or commit of a hub id) for vLLM and kveval."),
    "trust_remote_code": ("--trust-remote-code", bool, "Run the model's own code (vLLM and kveval's loaders)."),
    "max_num_seqs": ("--max-num-seqs", int, "Requests an engine batches at most."),
    "attention_backend": ("--attention-backend", str, "vLLM's attention backend (e.g. FLASH_ATTN, TRITON_ATTN)."),
}


def vllm_options(command):
    for key, (flag, kind, text) in reversed(list(VLLM_OPTIONS.items())):
        if kind is bool:
            command = click.option(flag, key, is_flag=True, default=False, help=text)(command)
        else:
            command = click.option(flag, key, type=kind, default=None, help=text)(command)
    return command


def _with_vllm_options(options: dict, engine_args: dict) -> dict:
    """--engine-arg plus the first-class vLLM options; one setting given both ways is a usage error."""
    merged = dict(engine_args)
    for key, (flag, kind, _) in VLLM_OPTIONS.items():
        value = options.pop(key)
        if value in (None, False):
            continue
        if key in merged:
            raise UsageFailure(f"{flag} and --engine-arg {key}=... both given; give one")
        merged[key] = value
    return merged


def _json_object(text: str | None, flag: str) -> dict | None:
    try:
        return parse_json_object(text, flag)
    except ValueError as error:
        raise UsageFailure(str(error)) from None


def compare_arguments(given: dict) -> dict:
    """`kveval compare`'s parsed options as keyword arguments of kveval.api.compare (CompareOptions)."""
    options = dict(given)
    engine_args = _with_vllm_options(options, parse_key_value(options["engine_args"], "--engine-arg"))
    full = options.pop("full")
    if full and options["suite"] not in ("standard", "full"):
        raise UsageFailure(f"--full and --suite {options['suite']} contradict each other; give one")
    tasks = options.pop("tasks")
    options["gpus"] = tuple(options["gpus"]) or None
    # Not given: the suite's levels (click hands an empty tuple for a multi-value option left out).
    options["slo"] = split_values(options["slo"]) if options.get("slo") else None
    options["concurrency"] = parse_int_list(options["concurrency"], "--concurrency") if options.get("concurrency") else None
    options.update(
        kv=split_values(options["kv"]),
        # Left out: None, so the API runs the default lengths that the model can hold.
        max_model_len=parse_int_list(options["max_model_len"], "--max-model-len") if options["max_model_len"] else None,
        engine_args=engine_args, phases=split_values(options["phases"]),
        chat_template_kwargs=_json_object(options["chat_template_kwargs"], "--chat-template-kwargs"),
        suite="full" if full else options["suite"], tasks=split_values(tasks) if tasks else None,
        gate_overrides=parse_thresholds(options.pop("thresholds")), command=shlex.join(["kveval", *sys.argv[1:]]),
        **task_shape_kwargs(options.pop("task_lengths"), options.pop("task_depths"), options.pop("task_samples")),
    )
    return options


@cli.command(context_settings=CONTEXT)
@click.option("--model", default=None, metavar="ID|DIR|FILE.gguf",
              help="Hugging Face model id, local directory or GGUF file (dequantised once into $KVEVAL_HOME). "
                   "Default: the embedded SmolLM2-135M-Instruct.")
@click.option("--kv", "--kv-cache-dtype", "kv", cls=MultiValueOption, default=defaults.KV,
              show_default=_spaced(defaults.KV),
              help="KV-cache configurations to compare (vLLM's --kv-cache-dtype values), e.g. --kv fp8 auto (also "
                   "--kv fp8 --kv auto, --kv fp8,auto); fp8:keep=0,1 keeps layers 0 and 1 in the model dtype "
                   "(vLLM's --kv-cache-dtype-skip-layers 0 1); fp8:scaled / fp8:scaled=head use per-tensor / per-head "
                   "K/V scales calibrated once with llm-compressor (combinable: fp8:scaled,keep=0).")
@click.option("--max-model-len", "max_model_len", cls=MultiValueOption, default=(),
              show_default=_spaced(defaults.MAX_MODEL_LEN) + ", without those over the model's limit",
              help="max_model_len values, e.g. --max-model-len 2048 8192 32768.")
@click.option("--out", default=None, metavar="DIR", help="Run directory. Default: runs/<model>-<time>.")
@click.option("--kv-cache-memory", "--kv-cache-memory-bytes", "kv_cache_memory", default=None, metavar="SIZE",
              help="KV-cache budget per engine (vLLM's --kv-cache-memory-bytes), e.g. 150MiB or 157286400, to "
                   "emulate a smaller GPU.")
@click.option("--gpu-memory-utilization", type=float, default=None, help="Passed to vLLM.")
@click.option("--enforce-eager/--no-enforce-eager", default=False, show_default=True, help="Passed to vLLM.")
@vllm_options
@click.option("--engine-arg", "engine_args", cls=MultiValueOption, split_commas=False, default=(), metavar="KEY=VALUE",
              help="Any other vllm.LLM argument, e.g. --engine-arg dtype=float32 (repeatable; JSON values).")
@click.option("--seed", type=int, default=defaults.SEED, show_default=True,
              help="Seed of every random choice kveval makes (scoring documents, task samples, probe order); "
                   "generation is greedy, so the same seed gives the same inputs in every cell.")
@click.option("--prompts", type=click.Path(dir_okay=False), default=None, metavar="FILE.jsonl",
              help='Your own prompts, one JSON object per line: {"prompt": ...} or {"messages": [...]}.')
@click.option("--chat-template-kwargs", "chat_template_kwargs", default=None, metavar="JSON",
              help="Arguments of every chat-template rendering (vLLM's chat_template_kwargs), as a JSON object, "
                   "e.g. '{\"enable_thinking\": false}' so a thinking template answers the tasks outside <think>.")
@click.option("--suite", type=click.Choice(list(SUITES)), default=defaults.SUITE, show_default=True,
              help="standard: field-study shape; quick: one prompt per workload, short answers, few task samples "
                   "(CPU demo); full: standard with 5 samples per task point (GPU runs).")
@click.option("--full", is_flag=True, help="Same as --suite full.")
@click.option("--tasks", "--task", "tasks", cls=MultiValueOption, default=None, metavar="NAME...",
              help="Long-context tasks per cell: kveval's passkey niah_single niah_multikey niah_multivalue vt cwe "
                   "(default: all six), 'none' to skip, or any lm-eval task name whose data is local.")
@click.option("--limit", "task_limit", type=int, default=None,
              help="At most this many samples per task (kveval's tasks keep them spread over sizes and depths).")
@task_shape_options("suite's, e.g. ")
@click.option("--speed-runs", type=int, default=None, help="Measured speed runs per workload (default: suite's).")
@click.option("--speed-warmup", type=int, default=None, help="Warm-up runs before them (default: suite's).")
@click.option("--concurrency", cls=MultiValueOption, default=None, metavar="N...",
              help="Throughput sweep: requests submitted at once per level (default: suite's, e.g. 1 4 16 64; "
                   "each cell also runs its own maximum concurrency).")
@click.option("--repeat-target", type=float, default=None, metavar="SHARE",
              help="Repeat each throughput level and speed workload until the 95 % interval of its median is within "
                   "this share of it (default 0.05: ±5 %), within --repeat-budget.")
@click.option("--repeat-budget", type=float, default=None, metavar="SECONDS",
              help="Seconds per cell and speed phase (speed, throughput) for those repeats (default: suite's, 60 and "
                   "180; quick 30 and 60); 0: the first run of each level only.")
@click.option("--prefer", type=click.Choice(list(defaults.PREFERENCES)), default=defaults.PREFER, show_default=True,
              help="Which passing configuration to deploy: the one holding the most KV (capacity), the best output "
                   "tok/s against auto (throughput) or the least TTFT against auto (latency).")
@click.option("--slo", cls=MultiValueOption, default=None, metavar="METRIC_pNN=VALUE...",
              help="Service-level objectives in vLLM bench's terms, e.g. --slo ttft_p99=2s tpot_p99=100ms: the deploy "
                   "answer is the passing configuration with the most goodput (requests/s at the highest concurrency "
                   "level meeting every objective).")
@click.option("--cell-timeout", type=float, default=defaults.CELL_TIMEOUT_S, show_default=True,
              help="Seconds before a cell is stopped.")
@click.option("--stall-timeout", type=float, default=defaults.STALL_TIMEOUT_S, show_default=True,
              help="Seconds a started cell may go without finishing a step before it is stopped as stalled (an engine "
                   "that hangs is reported as a defect of that configuration, not as FP8 damage).")
@click.option("--phases", cls=MultiValueOption, default=defaults.PHASES,
              show_default=_spaced(defaults.PHASES), help="Phases to run in each cell, in order.")
@click.option("--remedy", type=click.Choice(list(REMEDY_MODES)), default=defaults.REMEDY, show_default=True,
              help="auto: when an FP8 cell FAILs, run it again with the layers whose K/V leave the FP8 range kept in "
                   "the model dtype; always: try that after every started FP8 cell; off: never.")
@click.option("--search", is_flag=True,
              help="Find the KV configuration with the most capacity that passes: try fp8, then fp8:scaled (per-tensor "
                   "scales calibrated with llm-compressor), fp8:scaled=head, the diagnosed layers kept in the model "
                   "dtype (fewest first) and combinations, each judged by the same gate, until one PASSes at each "
                   "--max-model-len (also --kv search).")
@click.option("--budget", default=None, metavar="N|TIME|N,TIME",
              help="Evidence until decided: while a tested cell is INCONCLUSIVE because its task accuracy, its "
                   "degeneration or its divergence is not yet decided, run rounds of new task samples, new probes "
                   "and/or new scored documents (up to 48 per cell) for it and its auto baseline, up to N paired "
                   "samples per cell (also the sequential design's N_max) and/or TIME of round time (90s, 10m, "
                   "1h), whichever comes first; 0 or off: no rounds. Default: 600,20m on a CPU, 1200,20m on a GPU "
                   "(a time alone keeps that cap).")
@click.option("--diagnose/--no-diagnose", default=defaults.DIAGNOSE, show_default=True,
              help="Measure each layer's K/V range with transformers (once per run) against the FP8 range.")
@click.option("--retry-failed", is_flag=True,
              help="Resuming into the same --out: also redo cells that did not start for a reason of their "
                   "configuration (by default only unfinished, crashed and transiently failed cells are redone).")
@click.option("--gpus", cls=MultiValueOption, default=(), metavar="IDS|all",
              help="Run independent cells at once, one per GPU (e.g. --gpus 0,1 or --gpus all); a cell with "
                   "--engine-arg tensor_parallel_size=N takes N. Default: one cell at a time.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: each cell's process on this machine; ray: each cell a Ray task on a Ray cluster, with "
                   "its GPUs (needs pip install 'kveval[ray]'; results land in --out here).")
@click.option("--ray-address", metavar="ADDRESS", default=None,
              help="--executor ray: the cluster to join (e.g. ray://head:10001 or auto). Default: $RAY_ADDRESS, "
                   "else a Ray started on this machine for the run.")
@click.option("--baseline-from", "baseline_from", type=click.Path(file_okay=False), default=None, metavar="RUN_DIR",
              help="Take the auto cells of an earlier run (`kveval baseline`, made where auto fits: a larger GPU, a "
                   "CPU) as the baseline and start only the other cells; refused, before any engine, unless both "
                   "runs have the same weights, tokenizer, chat template, prompts, documents, task samples, seed and "
                   "sampling settings, and an auto cell at each --max-model-len.")
@click.option("--fresh", is_flag=True,
              help="--out holds a run with other settings (or a damaged one): move it aside to OUT.replaced-<time> "
                   "and start anew.")
@gate_options
def compare(**given) -> None:
    """Compare KV-cache dtypes across max_model_len values, one vLLM engine per cell.

    Exits 0 when the configurations given with --kv pass (deployable as asked), 4 when they do not but a
    configuration kveval tested passes (a remedy, a --search candidate, or the same one capped at a shorter
    --max-model-len: see the review's deploy line), 1 when no tested FP8 configuration is deployable (FAIL),
    3 when undecided (INCONCLUSIVE), 2 on a usage error, 130 when interrupted."""
    from kveval.api import KvevalError, RunInterrupted, compare as run_compare

    try:
        result = run_compare(**compare_arguments(given))
    except RunInterrupted as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:  # before the first cell: the run was still being set up
        click.echo("Error: interrupted while the run was being set up, before any cell ran; nothing was measured. "
                   "Run the same command again to start it.", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    _finish(result)


# `kveval baseline`: compare's options less those a baseline run sets itself (issue 39).
_NOT_FOR_BASELINE = {"kv", "phases", "remedy", "search", "diagnose", "baseline_from", "prefer", "slo", "concurrency",
                     "repeat_target", "repeat_budget", "speed_runs", "speed_warmup", "budget", "thresholds",
                     "gate_config"}


def baseline(**given) -> None:
    """Make a portable baseline run: the auto cells only, generation, scoring and tasks, for a later
    `kveval compare --kv fp8 --baseline-from RUN_DIR` where auto cannot start at these lengths (FP8's
    lengths on a small card). Give it the same --model, --max-model-len, --seed, --suite, --tasks and
    --prompts as that run; make it where auto fits (a larger GPU, or a CPU with --kv-cache-memory).

    Prints the run directory; exits 0 when every auto cell started, 3 when one did not, 2 on a usage error."""
    from kveval.api import KvevalError, RunInterrupted, baseline as run_baseline

    arguments = compare_arguments({"kv": (), "phases": (), "thresholds": (), **given})   # what compare_arguments reads
    for name in _NOT_FOR_BASELINE | {"gate_overrides"}:
        arguments.pop(name, None)
    try:
        result = run_baseline(**arguments)
    except RunInterrupted as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    click.echo(str(result.run_dir))
    missing = [c.id for c in result.manifest.cells if not ((cell := result.cells.get(c.id)) and cell.started)]
    if missing:
        click.echo(f"Baseline incomplete: {', '.join(missing)} did not start (see {result.review_path})", err=True)
        sys.exit(3)
    click.echo(f"Baseline ready: kveval compare --kv fp8 --baseline-from {result.run_dir} with the same --model, "
               "--max-model-len, --seed, --suite and --tasks", err=True)
    sys.exit(0)


cli.add_command(click.Command("baseline", callback=baseline, help=baseline.__doc__, context_settings=CONTEXT,
                              params=[param for param in compare.params if param.name not in _NOT_FOR_BASELINE]))


def _recompute(run_dir, gate_config, thresholds):
    from kveval.api import KvevalError, report as run_report, run_in_progress

    overrides = parse_thresholds(thresholds)
    writer = run_in_progress(run_dir)
    if writer:
        click.echo(f"Note: a run is still writing {run_dir} ({writer}); this verdict covers the cells finished "
                   "so far.", err=True)
    try:
        return run_report(run_dir, gate_config=gate_config, gate_overrides=overrides)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None


@cli.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
@gate_options
def report(run_dir, gate_config, thresholds) -> None:
    """Recompute RUN_DIR's verdict, results.json, tables/, review.md and review.html from the stored results
    (no engine).

    Prints the review's path (its HTML page's on stderr); exits as `compare` does: 0 deployable as asked, 4 a configuration kveval tested
    passes where the asked one does not, 1 nothing FP8 deployable, 3 undecided, 2 usage error."""
    _finish(_recompute(run_dir, gate_config, thresholds))


@cli.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
@gate_options
@click.option("--json", "as_json", is_flag=True,
              help="Print the verdict as JSON (verdict, per-cell verdicts, reasons with stable codes, deployment, "
                   "decision) and write nothing into RUN_DIR.")
@click.option("--require", default="plain", show_default=True, metavar="plain|any",
              help="What exits 0. plain: the configurations given with --kv pass at every tested length. any: any "
                   "tested FP8 configuration passes (a remedy or --search candidate, or the asked one capped at a "
                   "shorter --max-model-len): code 4 becomes 0; deploy the review's deploy line, whose "
                   "--max-model-len cap may be under the longest length tested.")
def gate(run_dir, gate_config, thresholds, as_json, require) -> None:
    """Judge a stored run (no engine): print the verdict and its reasons, exit with its code.

    0 deployable as asked, 4 what was asked does not pass but a configuration kveval tested does (0 with
    --require any), 1 no tested FP8 configuration is deployable (FAIL), 3 undecided (INCONCLUSIVE), 2 usage
    error (bad run directory, thresholds file, --threshold or --require). results.json, review.md and review.html
    are rewritten with the verdict, except with --json."""
    from kveval.api import KvevalError, checked_require

    try:
        require = checked_require(require)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    if as_json:
        import json

        from kveval.api import judge_decision

        try:
            verdict, deployment, decision = judge_decision(run_dir, gate_config=gate_config,
                                                           gate_overrides=parse_thresholds(thresholds))
        except KvevalError as error:
            raise UsageFailure(str(error)) from None
        code = run_exit_code(decision, require)
        click.echo(json.dumps({"verdict": verdict.status, **verdict.to_dict(code), "require": require,
                               "deployment": deployment.model_dump(mode="json", exclude_unset=True),
                               "decision": decision.model_dump(mode="json")}, indent=1))
        sys.exit(code)
    result = _recompute(run_dir, gate_config, thresholds)
    code = run_exit_code(result.decision, require)
    _echo_verdict(result.verdict, result.decision)
    click.echo(f"exit code {code} (--require {require})")
    click.echo(f"results: {result.results_path}")
    click.echo(f"review: {result.review_path}")
    click.echo(f"html: {result.html_path}")
    sys.exit(code)


def _echo_verdict(verdict, decision) -> None:
    """Status first (the asked configurations', as the review's heading), the two answers; then what decided
    it (for PASS: every passed check), then the notes."""
    click.echo(decision.asked)
    click.echo(f"- {_decision_text(decision)}")
    if verdict.status == "PASS":
        for check in verdict.checks:
            if check.passed:
                click.echo(f"- ok {check.cell}: {check.name} {_short(check.value)} (limit {_short(check.limit)})")
    deciding = [r for r in verdict.reasons if r.level == verdict.status]
    for reason in deciding + [r for r in verdict.reasons if r.level != verdict.status]:
        prefix = "" if reason.level == verdict.status else f"({reason.level.lower()}) "
        click.echo(f"- {prefix}{reason.message}")
    floor = verdict.noise_floor
    click.echo("noise floor: " + ("not measured" if not floor else
                                  f"KL mean {_short(floor.get('kl_mean'))}, KL p99 {_short(floor.get('kl_p99'))}, "
                                  f"top-1 disagreement {_short(floor.get('top1_disagreement'))}"))


def _short(value) -> str:
    return "n/a" if value is None else f"{value:.3g}"


@cli.command(context_settings=CONTEXT)
@click.argument("run_a", type=click.Path(file_okay=False))
@click.argument("run_b", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True,
              help="Print the comparison as JSON (per matched cell: verdict, KL, top-1, task accuracy with its "
                   "interval, KV pool; speed; cells of one run only; `worse`; `recommendation` and "
                   "`recommendation_changed`) instead of markdown.")
def diff(run_a, run_b, as_json) -> None:
    """What changed from RUN_A to RUN_B, two runs of the same model (a vLLM upgrade, another GPU, another
    revision): verdict, divergence, task accuracy, KV pool and speed per cell (same KV spec and
    max_model_len), each change judged against the runs' own noise; and the recommendation (deploy
    command, configuration, --max-model-len cap, exit code), a change of it reported, not judged worse.
    Reads results.json; writes nothing.

    Exits 5 when B got worse (a cell's verdict rose: PASS < INCONCLUSIVE < FAIL, or its KL mean, top-1
    agreement or task accuracy changed beyond noise the harmful way), 0 when not, 2 on a usage error
    (missing run, no results.json, runs of different models)."""
    from kveval.api import EXIT_WORSE, KvevalError, diff_markdown, diff_runs

    try:
        result = diff_runs(run_a, run_b)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    if as_json:
        import json

        click.echo(json.dumps(result.model_dump(mode="json"), indent=1))
    else:
        click.echo(diff_markdown(result), nl=False)
    sys.exit(EXIT_WORSE if result.worse else 0)


@cli.command("schema", context_settings=CONTEXT)
@click.argument("kind", type=click.Choice(["results", "manifest", "cell", "kv_ranges"]), default="results")
def schema_command(kind) -> None:
    """Print the JSON Schema of a run file: results.json (default), manifest.json, cells/<cell>.json
    or kv_ranges.json. `kveval report` checks every file it reads against these."""
    import json

    from kveval.api import file_schema

    click.echo(json.dumps(file_schema(kind), indent=1))


@cli.command(context_settings=CONTEXT)
@click.option("--prepare", is_flag=True, help="Convert the default model now if it is not yet.")
def models(prepare) -> None:
    """Show where the embedded default model lives (and prepare it)."""
    from kveval.api import KvevalError, default_model, kveval_home

    try:
        info = default_model(prepare, progress=lambda m: click.echo(m, err=True))
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    click.echo(f"default model: {info.name}")
    click.echo(f"  path:   {info.path}")
    click.echo(f"  ready:  {'yes' if info.ready else 'no (converted on first use, or run: kveval models --prepare)'}")
    click.echo(f"  source: {info.source}")
    click.echo(f"cache (KVEVAL_HOME): {kveval_home()}")


@cli.group("tasks", context_settings=CONTEXT)
def tasks_group() -> None:
    """kveval's long-context tasks (lm-eval YAMLs at `kveval tasks path`): list them, or generate their data."""


@tasks_group.command("list")
def tasks_list() -> None:
    """The tasks, their answer budgets and what they test."""
    from kveval.api import TASK_GROUP, TASKS_BY_NAME

    for spec in TASKS_BY_NAME.values():
        click.echo(f"{spec.name:<24} ({spec.short}, answer ≤ {spec.max_gen_toks} tokens) {spec.description}")
    click.echo(f"group: {TASK_GROUP} (all of them)")


@tasks_group.command("path")
def tasks_path() -> None:
    """Print the directory of kveval's lm-eval task YAMLs (for lm_eval --include_path)."""
    from kveval.api import lm_eval_tasks_dir

    click.echo(str(lm_eval_tasks_dir()))


@tasks_group.command("generate", context_settings=CONTEXT)
@click.option("--model", default=None, metavar="ID|DIR", help="Tokenizer to size samples with (default model if omitted).")
@click.option("--max-model-len", "max_model_len", required=True, metavar="TOKENS", help="The context to size samples for.")
@click.option("--out", required=True, metavar="DIR", help="Directory for <task>.jsonl files.")
@click.option("--tasks", "--task", "tasks", cls=MultiValueOption, default=None, metavar="NAME...",
              help="kveval tasks to generate (default: all six).")
@task_shape_options("")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the generated samples (needles, filler).")
def tasks_generate(model, max_model_len, out, tasks, task_lengths, task_depths, task_samples, seed) -> None:
    """Generate task data for the stock lm_eval CLI:

    lm_eval --include_path "$(kveval tasks path)" --tasks kveval_longctx --metadata '{"data_dir": "OUT"}' ..."""
    from kveval.api import KvevalError, generate_task_data

    (length,) = parse_int_list([max_model_len], "--max-model-len")
    try:
        written = generate_task_data(
            out, length, model=model, tasks=split_values(tasks) if tasks else None,
            **task_shape_kwargs(task_lengths, task_depths, task_samples), seed=seed, progress=lambda m: click.echo(m, err=True))
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    for task, entry in written.items():
        where = f"{out}/{entry['file']}" if entry.get("file") else "no file"
        click.echo(f"{task}: {entry.get('docs')} samples -> {where}")
        for fraction, why in (entry.get("skipped") or {}).items():
            click.echo(f"  skipped {float(fraction):g} x max_model_len: {why}", err=True)


def _terminate(signum, frame):
    # SIGTERM (e.g. a CI timeout) takes the same path as Ctrl-C: cell processes are stopped and
    # what was measured is kept.
    raise KeyboardInterrupt


EXIT_INTERNAL = 70   # sysexits' EX_SOFTWARE: 4 is a verdict's (EXIT_FOUND) since issue 41


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli(prog_name="kveval", standalone_mode=True)
    except SystemExit:
        raise
    except Exception:
        # Python exits 1 on an uncaught exception, which a CI gate would read as FAIL: a crash of kveval
        # itself gets its own code, with the traceback for the bug report.
        import traceback

        traceback.print_exc()
        click.echo(f"kveval: internal error (exit {EXIT_INTERNAL}): the traceback above is a bug in kveval, not a verdict; "
                   "measured cells are kept in the run directory", err=True)
        sys.exit(EXIT_INTERNAL)


if __name__ == "__main__":
    main()
