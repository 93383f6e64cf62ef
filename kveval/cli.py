"""The `kveval` command: a thin click shell over kveval.api. User errors print one clean line."""
from __future__ import annotations

import shlex
import signal
import sys

import click

from . import __version__
from .cli_options import MultiValueOption, parse_int_list, parse_key_value, split_values

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="kveval")
def cli() -> None:
    """May this model run with an FP8 KV cache? Start real vLLM engines and find out."""


@cli.command(context_settings=CONTEXT)
@click.option("--model", default=None, metavar="ID|DIR",
              help="Hugging Face model id or local directory. Default: the embedded SmolLM2-135M-Instruct.")
@click.option("--kv", cls=MultiValueOption, default=("fp8", "auto"), show_default="fp8 auto",
              help="KV-cache dtypes to compare, e.g. --kv fp8 auto (also --kv fp8 --kv auto, --kv fp8,auto).")
@click.option("--max-model-len", "max_model_len", cls=MultiValueOption, default=("2048", "8192", "32768"),
              show_default="2048 8192 32768", help="max_model_len values, e.g. --max-model-len 2048 8192 32768.")
@click.option("--out", default=None, metavar="DIR", help="Run directory. Default: runs/<model>-<time>.")
@click.option("--kv-cache-memory", default=None, metavar="SIZE",
              help="KV-cache budget per engine (vLLM kv_cache_memory_bytes), e.g. 150MiB, to emulate a smaller GPU.")
@click.option("--gpu-memory-utilization", type=float, default=None, help="Passed to vLLM.")
@click.option("--enforce-eager/--no-enforce-eager", default=False, show_default=True, help="Passed to vLLM.")
@click.option("--engine-arg", "engine_args", cls=MultiValueOption, split_commas=False, default=(), metavar="KEY=VALUE",
              help="Any other vllm.LLM argument, e.g. --engine-arg dtype=float32 (repeatable; JSON values).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--prompts", type=click.Path(dir_okay=False), default=None, metavar="FILE.jsonl",
              help='Your own prompts, one JSON object per line: {"prompt": ...} or {"messages": [...]}.')
@click.option("--suite", type=click.Choice(["standard", "quick"]), default="standard", show_default=True,
              help="standard: field-study shape; quick: one prompt per workload, short answers (CPU demo).")
@click.option("--speed-runs", type=int, default=None, help="Measured speed runs per workload (default: suite's).")
@click.option("--speed-warmup", type=int, default=None, help="Warm-up runs before them (default: suite's).")
@click.option("--cell-timeout", type=float, default=3600, show_default=True, help="Seconds before a cell is stopped.")
@click.option("--phases", cls=MultiValueOption, default=("generation", "scoring", "speed"),
              show_default="generation scoring speed", help="Phases to run in each cell, in order.")
def compare(model, kv, max_model_len, out, kv_cache_memory, gpu_memory_utilization, enforce_eager, engine_args, seed,
            prompts, suite, speed_runs, speed_warmup, cell_timeout, phases) -> None:
    """Compare KV-cache dtypes across max_model_len values, one vLLM engine per cell."""
    from .api import KvevalError, RunInterrupted, compare as run_compare

    lengths = parse_int_list(max_model_len, "--max-model-len")
    try:
        result = run_compare(
            model=model, kv=split_values(kv), max_model_len=lengths, out=out, kv_cache_memory=kv_cache_memory,
            gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager,
            engine_args=parse_key_value(engine_args, "--engine-arg"), seed=seed, prompts=prompts, suite=suite,
            speed_runs=speed_runs, speed_warmup=speed_warmup, cell_timeout=cell_timeout, phases=split_values(phases),
            command=shlex.join(["kveval", *sys.argv[1:]]),
        )
    except RunInterrupted as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(130)
    except KvevalError as error:
        raise click.ClickException(str(error)) from None
    click.echo(str(result.review_path))


@cli.command(context_settings=CONTEXT)
@click.argument("run_dir", type=click.Path(file_okay=False))
def report(run_dir) -> None:
    """Re-render RUN_DIR/review.md from the stored results (no engine)."""
    from .api import KvevalError, report as run_report

    try:
        result = run_report(run_dir)
    except KvevalError as error:
        raise click.ClickException(str(error)) from None
    click.echo(str(result.review_path))


@cli.command(context_settings=CONTEXT)
@click.option("--prepare", is_flag=True, help="Convert the default model now if it is not yet.")
def models(prepare) -> None:
    """Show where the embedded default model lives (and prepare it)."""
    from .models import ModelError, default_model_info, kveval_home, prepare_default_model

    if prepare:
        try:
            prepare_default_model(progress=lambda m: click.echo(m, err=True))
        except ModelError as error:
            raise click.ClickException(str(error)) from None
    info = default_model_info()
    click.echo(f"default model: {info.name}")
    click.echo(f"  path:   {info.path}")
    click.echo(f"  ready:  {'yes' if info.ready else 'no (converted on first use, or run: kveval models --prepare)'}")
    click.echo(f"  source: {info.source}")
    click.echo(f"cache (KVEVAL_HOME): {kveval_home()}")


def _terminate(signum, frame):
    # SIGTERM (e.g. a CI timeout) takes the same path as Ctrl-C: cell processes are stopped and
    # what was measured is kept.
    raise KeyboardInterrupt


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    cli(prog_name="kveval")


if __name__ == "__main__":
    main()
