"""The `kveval` command: a thin click shell over kveval.api. User errors print one clean line.

Exit codes (kveval.gate.decision): 0 deployable as asked (PASS), 1 no tested FP8 configuration is deployable
(FAIL), 2 usage error or unusable input, 3 undecided (INCONCLUSIVE), 4 what was asked does not pass but a
configuration kveval tested does (kveval.api.EXIT_FOUND; 0 with `gate --require any`); 5 `kveval diff`: run B
got worse than run A (kveval.api.EXIT_WORSE); 70 an internal error of kveval (never read as a verdict); 130
when a compare is interrupted.
"""
from __future__ import annotations

import shlex
import signal
import sys

import click

from kveval import __version__
from kveval.cli.model_options import compare_model_options, gate_options
from kveval.cli.options import (MultiValueOption, parse_float_list, parse_int_list, parse_json_object,
                                 parse_key_value, split_values)
from kveval import defaults
from kveval.api import EXIT_USAGE, VLLM_SHORTCUTS, command_line_options, run_exit_code

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
EXIT_INTERRUPTED = 130


class UsageFailure(click.ClickException):
    """A bad input (option value, run directory, thresholds file): one line, exit code 2 (EXIT_USAGE),
    like click's own usage errors, so it never reads as FAIL (1) or INCONCLUSIVE (3)."""

    exit_code = EXIT_USAGE


def _spaced(values) -> str:
    return " ".join(str(v) for v in values)


def task_shape_options(default_prefix: str):
    """--task-lengths, --task-depths and --task-samples of `tasks generate` (compare's come from its options model)."""
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


def _with_vllm_options(options: dict, engine_args: dict) -> dict:
    """--engine-arg plus the first-class vLLM options (kveval.api.VLLM_SHORTCUTS); one setting given both ways
    is a usage error."""
    merged = dict(engine_args)
    for key, shortcut in VLLM_SHORTCUTS.items():
        value = options.pop(key)
        if value in (None, False):
            continue
        if key in merged:
            raise UsageFailure(f"{shortcut.flags[0]} and --engine-arg {key}=... both given; give one")
        merged[key] = value
    return merged


def _json_object(text: str | None, flag: str) -> dict | None:
    try:
        return parse_json_object(text, flag)
    except ValueError as error:
        raise UsageFailure(str(error)) from None


def _parsed(option, values: tuple[str, ...]):
    """A multi-value option's text as its field's type: `--max-model-len 2048 8k` -> (2048, 8192)."""
    if option.value is int:
        return parse_int_list(values, option.flags[0])
    if option.value is float:
        return parse_float_list(values, option.flags[0])
    return split_values(values)


def compare_arguments(given: dict) -> dict:
    """`kveval compare`'s (or `baseline`'s) parsed options as keyword arguments of kveval.api.compare
    (CompareOptions); an option left out is not passed, so the API's default holds."""
    options = dict(given)
    engine_args = _with_vllm_options(options, parse_key_value(options.pop("engine_args"), "--engine-arg"))
    full, suite = options.pop("full"), options.pop("suite")
    if full and suite not in ("standard", "full"):
        raise UsageFailure(f"--full and --suite {suite} contradict each other; give one")
    arguments = {
        "engine_args": engine_args, "suite": "full" if full else suite,
        "chat_template_kwargs": _json_object(options.pop("chat_template_kwargs"), "--chat-template-kwargs"),
        "command": shlex.join(["kveval", *sys.argv[1:]]),
    }
    if "gate_overrides" in options:   # `kveval baseline` has no gate options
        arguments["gate_overrides"] = parse_thresholds(options.pop("gate_overrides"))
    for option in command_line_options():   # the rest as their fields' types say
        if option.cli is None or option.name not in options:   # a shortcut, or parsed above
            continue
        value = options[option.name]
        if not option.many:
            arguments[option.name] = value
        elif value:   # click hands an empty tuple for a multi-value option left out
            arguments[option.name] = _parsed(option, value)
    return arguments


@cli.command(context_settings=CONTEXT)
@compare_model_options()
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


@cli.command(context_settings=CONTEXT)
@compare_model_options(lambda option: option.baseline)   # less what a baseline run sets itself (issue 39)
def baseline(**given) -> None:
    """Make a portable baseline run: the auto cells only, generation, scoring and tasks, for a later
    `kveval compare --kv fp8 --baseline-from RUN_DIR` where auto cannot start at these lengths (FP8's
    lengths on a small card). Give it the same --model, --max-model-len, --seed, --suite, --tasks and
    --prompts as that run; make it where auto fits (a larger GPU, or a CPU with --kv-cache-memory).

    Prints the run directory; exits 0 when every auto cell started, 3 when one did not, 2 on a usage error."""
    from kveval.api import KvevalError, RunInterrupted, baseline as run_baseline, baseline_gaps

    try:
        result = run_baseline(**compare_arguments(given))
    except RunInterrupted as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except KvevalError as error:
        raise UsageFailure(str(error)) from None
    click.echo(str(result.run_dir))
    gaps = baseline_gaps(result.run_dir)
    if gaps:
        click.echo(f"Baseline incomplete: {'; '.join(gaps)} (see {result.review_path})", err=True)
        sys.exit(3)
    click.echo(f"Baseline ready: kveval compare --kv fp8 --baseline-from {result.run_dir} with the same --model, "
               "--max-model-len, --seed, --suite and --tasks", err=True)
    sys.exit(0)


def _recompute(run_dir, gate_config, gate_overrides):
    from kveval.api import KvevalError, report as run_report, run_in_progress

    overrides = parse_thresholds(gate_overrides)
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
def report(run_dir, gate_config, gate_overrides) -> None:
    """Recompute RUN_DIR's verdict, results.json, tables/, review.md and review.html from the stored results
    (no engine).

    Prints the review's path (its HTML page's on stderr); exits as `compare` does: 0 deployable as asked, 4 a configuration kveval tested
    passes where the asked one does not, 1 nothing FP8 deployable, 3 undecided, 2 usage error."""
    _finish(_recompute(run_dir, gate_config, gate_overrides))


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
def gate(run_dir, gate_config, gate_overrides, as_json, require) -> None:
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
                                                           gate_overrides=parse_thresholds(gate_overrides))
        except KvevalError as error:
            raise UsageFailure(str(error)) from None
        code = run_exit_code(decision, require)
        click.echo(json.dumps({"verdict": verdict.status, **verdict.to_dict(code), "require": require,
                               "deployment": deployment.model_dump(mode="json", exclude_unset=True),
                               "decision": decision.model_dump(mode="json")}, indent=1))
        sys.exit(code)
    result = _recompute(run_dir, gate_config, gate_overrides)
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
    click.echo("noise floor: " + ("not measured" if floor is None else
                                  f"KL mean {_short(floor.kl_mean)}, KL p99 {_short(floor.kl_p99)}, "
                                  f"top-1 disagreement {_short(floor.top1_disagreement)}"))


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
