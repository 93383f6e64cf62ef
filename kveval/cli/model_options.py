"""The click options of `kveval compare` (and of `baseline`, `report` and `gate`, which take some of them),
built from kveval.api.command_line_options(): the fields of CompareOptions and their `Cli` declarations.
Nothing about an option is spelled here; a new field with a `Cli` is a new flag."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from kveval.api import CommandLineOption, command_line_options
from kveval.cli.options import MultiValueOption

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _spaced(values: Any) -> str:
    return " ".join(str(v) for v in values)


def click_option(option: CommandLineOption) -> Decorator:
    """One option as click declares it: the field's flags and type, its default and help."""
    cli = option.cli
    if cli is None:   # a shortcut: a flag, or one value
        if option.value is bool:
            return click.option(*option.flags, option.name, is_flag=True, default=False, help=option.help)
        return click.option(*option.flags, option.name, type=option.value, default=None, help=option.help)
    settings: dict[str, Any] = {"help": option.help}
    if cli.metavar:
        settings["metavar"] = cli.metavar
    if option.many:
        # Left out: no value, so kveval.api uses the field's default (the help shows it).
        show = cli.show_default
        if show is True:
            show = _spaced(option.default)
        return click.option(*option.flags, option.name, cls=MultiValueOption, split_commas=cli.split_commas,
                            default=(), show_default=show or None, **settings)
    if cli.repeat:
        return click.option(*option.flags, option.name, multiple=True, **settings)
    if option.value is bool:
        if cli.off_flag:
            flags = [f"{option.flags[0]}/{cli.off_flag}"]
            return click.option(*flags, option.name, default=option.default, show_default=cli.show_default or None,
                                **settings)
        return click.option(*option.flags, option.name, is_flag=True, **settings)
    if cli.choices:
        kind: Any = click.Choice(list(cli.choices))
    elif cli.path:
        kind = click.Path(dir_okay=cli.path != "file", file_okay=cli.path != "dir")
    else:
        kind = option.value
    return click.option(*option.flags, option.name, type=kind, default=option.default,
                        show_default=cli.show_default or None, **settings)


def compare_model_options(keep: Callable[[CommandLineOption], bool] = lambda option: True) -> Decorator:
    """The options of `kveval compare` that `keep` accepts, in the model's order."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(command_line_options()):
            if keep(option):
                command = click_option(option)(command)
        return command
    return decorate


# --gate-config and --threshold: shared by compare, report and gate.
GATE_FIELDS = ("gate_config", "gate_overrides")
gate_options = compare_model_options(lambda option: option.field in GATE_FIELDS)
