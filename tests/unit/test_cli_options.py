"""Tests for kveval.cli.options, run through click's CliRunner on a throwaway command."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from kveval.cli.options import (
    MultiValueOption,
    parse_int_list,
    parse_key_value,
    split_values,
)


@click.command()
@click.option("--kv", cls=MultiValueOption, default=("auto",), show_default=True)
@click.option("--max-model-len", "-L", "max_model_len", cls=MultiValueOption)
@click.option("--engine-arg", "engine_args", cls=MultiValueOption, split_commas=False)
@click.option("--out", default=None)
@click.option("--dry-run", is_flag=True)
def cmd(kv, max_model_len, engine_args, out, dry_run):  # type: ignore[no-untyped-def]
    """Echo what was parsed, as JSON."""
    click.echo(
        json.dumps(
            {
                "kv": list(kv),
                "lens": list(parse_int_list(max_model_len, "--max-model-len")),
                "engine": parse_key_value(engine_args, "--engine-arg"),
                "out": out,
                "dry_run": dry_run,
            }
        )
    )


def run(*args: str) -> click.testing.Result:
    return CliRunner().invoke(cmd, list(args))


def ok(*args: str) -> dict:
    result = run(*args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_space_separated_values_verbatim() -> None:
    got = ok("--kv", "fp8", "auto", "--max-model-len", "2048", "8192", "32768", "--out", "x")
    assert got["kv"] == ["fp8", "auto"]
    assert got["lens"] == [2048, 8192, 32768]
    assert got["out"] == "x"


def test_repeated_flags() -> None:
    assert ok("--kv", "fp8", "--kv", "auto")["kv"] == ["fp8", "auto"]


def test_comma_lists() -> None:
    got = ok("--kv", "fp8,auto", "--max-model-len", "2048,8k")
    assert got["kv"] == ["fp8", "auto"]
    assert got["lens"] == [2048, 8192]


def test_mixed_forms_dedupe_in_first_order() -> None:
    got = ok("--kv", "fp8,auto", "fp8_e5m2", "--out", "o", "--kv", "fp8", "-L", "32K", "8k,2048")
    assert got["kv"] == ["fp8", "auto", "fp8_e5m2"]
    assert got["lens"] == [32768, 8192, 2048]
    assert got["out"] == "o"


def test_equals_form_then_more_values() -> None:
    assert ok("--kv=fp8", "auto")["kv"] == ["fp8", "auto"]


def test_flag_ends_the_value_list() -> None:
    got = ok("--kv", "fp8", "auto", "--dry-run", "-L", "1024")
    assert got["kv"] == ["fp8", "auto"]
    assert got["dry_run"] is True
    assert got["lens"] == [1024]


def test_default_used_when_absent() -> None:
    got = ok("--out", "x")
    assert got["kv"] == ["auto"]
    assert got["lens"] == []


def test_value_missing_at_end_is_usage_error() -> None:
    result = run("--kv")
    assert result.exit_code == 2
    assert "Option '--kv' requires an argument" in result.output


def test_value_missing_before_next_option_is_usage_error() -> None:
    result = run("--kv", "--out", "x")
    assert result.exit_code == 2
    assert "Option '--kv' requires at least one value." in result.output
    assert "Usage:" in result.output


def test_empty_equals_value_is_usage_error() -> None:
    result = run("--kv=", "--out", "x")
    assert result.exit_code == 2
    assert "Invalid value for '--kv'" in result.output


def test_bad_integer_is_usage_error_naming_option() -> None:
    result = run("--max-model-len", "2048", "lots")
    assert result.exit_code == 2
    assert "Invalid value for '--max-model-len'" in result.output
    assert "'lots'" in result.output


def test_engine_args_keep_commas_and_parse_json() -> None:
    got = ok(
        "--engine-arg", "enforce-eager=true", "max_num_seqs=4", "cudagraph_capture_sizes=[1,2]",
        "--kv", "fp8",
    )
    assert got["engine"] == {
        "enforce_eager": True,
        "max_num_seqs": 4,
        "cudagraph_capture_sizes": [1, 2],
    }
    assert got["kv"] == ["fp8"]


def test_short_option_alias_is_greedy_too() -> None:
    assert ok("-L", "1k", "2k")["lens"] == [1024, 2048]


def test_help_lists_option() -> None:
    result = run("--help")
    assert result.exit_code == 0
    assert "--kv VALUE..." in result.output


def test_option_definition_errors() -> None:
    with pytest.raises(TypeError):
        MultiValueOption(["--x"], nargs=2)
    with pytest.raises(TypeError):
        MultiValueOption(["--x"], type=int)
    with pytest.raises(TypeError):
        MultiValueOption(["--x"], is_flag=True)


def test_string_default_is_split() -> None:
    @click.command()
    @click.option("--kv", cls=MultiValueOption, default="fp8,auto")
    def c(kv):  # type: ignore[no-untyped-def]
        click.echo(",".join(kv))

    result = CliRunner().invoke(c, [])
    assert result.exit_code == 0
    assert result.output.strip() == "fp8,auto"


def test_required_option_missing() -> None:
    @click.command()
    @click.option("--kv", cls=MultiValueOption, required=True)
    def c(kv):  # type: ignore[no-untyped-def]
        click.echo(repr(kv))

    result = CliRunner().invoke(c, [])
    assert result.exit_code == 2
    assert "Missing option '--kv'" in result.output


# ------------------------------------------------------------ pure helpers


def test_split_values() -> None:
    assert split_values(["fp8,auto", " fp8 ", "", " , ", "fp8_e5m2"]) == ("fp8", "auto", "fp8_e5m2")
    assert split_values([]) == ()
    assert split_values("a,b") == ("a", "b")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["2048"], (2048,)),
        (["8k", "32K"], (8192, 32768)),
        (["2048,8192", "32768"], (2048, 8192, 32768)),
        (["1.5k"], (1536,)),
        (["1m"], (1048576,)),
        (["8192", "8k"], (8192,)),
        ([], ()),
    ],
)
def test_parse_int_list(values: list[str], expected: tuple[int, ...]) -> None:
    assert parse_int_list(values, "--max-model-len") == expected


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "1.5", "8g", "0.3k", "0k"])
def test_parse_int_list_rejects(bad: str) -> None:
    with pytest.raises(click.BadParameter) as info:
        parse_int_list([bad], "--max-model-len")
    assert "--max-model-len" in info.value.format_message()
    assert repr(bad) in info.value.format_message()


def test_parse_key_value() -> None:
    got = parse_key_value(
        [
            "max-num-seqs=8",
            "gpu_memory_utilization=0.5",
            "enforce_eager=false",
            "seed=null",
            "hf_overrides={\"a\": 1}",
            "tokenizer=/models/x",
            "dtype=bfloat16",
            "enable_prefix_caching=False",
            "empty=",
            "url=http://a/b?c=d",
        ]
    )
    assert got == {
        "max_num_seqs": 8,
        "gpu_memory_utilization": 0.5,
        "enforce_eager": False,
        "seed": None,
        "hf_overrides": {"a": 1},
        "tokenizer": "/models/x",
        "dtype": "bfloat16",
        "enable_prefix_caching": False,
        "empty": "",
        "url": "http://a/b?c=d",
    }


def test_parse_key_value_last_wins() -> None:
    assert parse_key_value(["a=1", "a=2"]) == {"a": 2}


@pytest.mark.parametrize("bad", ["novalue", "=3", " =3", "a.b=1"])
def test_parse_key_value_rejects(bad: str) -> None:
    with pytest.raises(click.BadParameter):
        parse_key_value([bad])


def test_a_crash_of_kveval_exits_70_never_a_verdict_code(monkeypatch, capsys):
    # Python's own exit code for an uncaught exception is 1, which a CI gate would read as FAIL; 4 is a
    # verdict's since issue 41 (a configuration kveval tested passes), so a crash has sysexits' EX_SOFTWARE.
    from kveval.cli import commands

    def broken(**_):
        raise KeyError("a renderer bug")

    monkeypatch.setattr(commands, "cli", broken)
    monkeypatch.setattr(commands.signal, "signal", lambda *args: None)  # keep pytest's own SIGTERM handling
    with pytest.raises(SystemExit) as stopped:
        commands.main()
    assert stopped.value.code == commands.EXIT_INTERNAL == 70
    assert stopped.value.code not in (0, 1, 2, 3, 4, 5)
    assert "internal error (exit 70)" in capsys.readouterr().err
