"""Print the README's table of `kveval compare` options, written from the options model (issue 42).

Every row comes from kveval.api.command_line_options(), the fields of CompareOptions with their `Cli`
declarations (kveval/run/option_model.py): the flags with their placeholder, then the option's README text.
Options whose text is SAME_ROW share the row before them.

    python scripts/options_table.py            # print the table
    python scripts/options_table.py --write    # replace the table in README.md with it

tests/unit/test_option_model.py checks that README.md holds exactly this table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from kveval.api import CommandLineOption, command_line_options

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| option | meaning |\n|---|---|\n"


def placeholder(option: CommandLineOption) -> str:
    """What follows the flag in the README: `N` for a number of things, the choices, or --help's metavar."""
    cli = option.cli
    if option.readme_metavar:
        return option.readme_metavar
    if cli and cli.choices:
        return "|".join(cli.choices)
    if cli and cli.metavar:
        return cli.metavar
    if option.many:
        return "VALUE..."
    return "N" if option.value is int else ""


def flags_cell(option: CommandLineOption) -> str:
    """`--kv`, `--kv-cache-dtype VALUE...`; `--diagnose / --no-diagnose`."""
    if option.cli and option.cli.off_flag:
        return f"`{option.flags[0]} / {option.cli.off_flag}`"
    last = " ".join(part for part in (option.flags[-1], placeholder(option)) if part)
    return ", ".join(f"`{flag}`" for flag in (*option.flags[:-1], last))


def table() -> str:
    """The table, its header and a line per row, each row ending in a newline."""
    rows: list[tuple[list[str], str]] = []
    for option in command_line_options():
        if option.readme:
            rows.append(([], option.readme))
        rows[-1][0].append(flags_cell(option).replace("|", "\\|"))
    return HEADER + "".join(f"| {', '.join(flags)} | {text} |\n" for flags, text in rows)


def readme_table(text: str) -> str:
    """The option table README.md holds now: from its header to the first line that is not a row."""
    start = text.index(HEADER)
    end = text.find("\n\n", start)
    return text[start:end + 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="replace the table in README.md")
    if parser.parse_args().write:
        text = README.read_text(encoding="utf-8")
        README.write_text(text.replace(readme_table(text), table()), encoding="utf-8")
    else:
        print(table(), end="")


if __name__ == "__main__":
    main()
