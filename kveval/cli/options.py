"""click helpers for kveval's matrix options.

The CLI must accept ``--kv fp8 auto --max-model-len 2048 8192 32768``
verbatim.  click refuses ``nargs=-1`` on options (``TypeError: nargs=-1 is
not supported for options``), so :class:`MultiValueOption` hooks click's
parser instead: after click takes the option's first value, the hook keeps
taking following tokens until one starts with ``-``.

Written against click 8.5.1 (``click/parser.py``: ``_OptionParser._long_opt``
/ ``_short_opt`` map option strings to ``_Option`` objects whose
``process(value, state)`` stores the value; ``state.rargs`` holds the tokens
not yet parsed).  The same names exist in click 8.0–8.1 (``OptionParser``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

import click

from kveval.api import KEEP_ATTENTION_TYPES as _KEEP_NAMES  # vLLM's names in kv_cache_dtype_skip_layers

__all__ = [
    "MultiValueOption",
    "split_values",
    "parse_int_list",
    "parse_key_value",
    "parse_json_object",
]


def _dedupe(values: Iterable[str]) -> tuple[str, ...]:
    """Drop repeats, keeping first-seen order (the matrix order is the user's)."""
    return tuple(dict.fromkeys(values))


def split_values(values: Iterable[str]) -> tuple[str, ...]:
    """Split comma lists, strip blanks, drop empties, de-duplicate in order.

    ``["fp8,auto", " fp8 ", ""]`` -> ``("fp8", "auto")``.
    """
    if isinstance(values, str):  # a lone string is one value, not characters
        values = [values]
    parts = []
    for value in values:
        for part in (p.strip() for p in str(value).split(",")):
            # `fp8:keep=0,1`, `fp8:scaled,keep=0`: a KV spec's options after ':' (keep=, its layer
            # list, scaled) are part of that one spec, not more values.
            if parts and ":" in parts[-1] and (
                    (("keep=" in parts[-1]) and (part.isdigit() or part in _KEEP_NAMES))
                    or part.startswith("keep=") or part == "scaled" or part.startswith("scaled=")):
                parts[-1] += "," + part
            else:
                parts.append(part)
    return _dedupe(p for p in parts if p)




_NEGATIVE_NUMBER = re.compile(r"^-\d")


def _looks_like_option(token: str) -> bool:
    """Stop token for greedy value taking: ``--out``, ``-x``, ``--``; not a negative number such as
    ``-5`` or ``-0.5``, which is a (bad) value that the option's own check then names."""
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


class MultiValueOption(click.Option):
    """An option taking one or more values: ``--kv fp8 auto``.

    Also accepts repeated flags (``--kv fp8 --kv auto``) and comma lists
    (``--kv fp8,auto``), in any mix.  The value is a tuple of strings,
    de-duplicated in first-seen order (``()`` when not given and no default).

    Values end at the next token starting with ``-``, so a value cannot
    itself start with ``-`` and positional arguments must not directly follow
    this option (put them first or after ``--``).

    ``split_commas=False`` keeps commas inside values, for ``key=[1,2]``
    style values such as ``--engine-arg``.
    """

    def __init__(self, *args: Any, split_commas: bool = True, **kwargs: Any) -> None:
        if kwargs.get("nargs", 1) != 1:
            raise TypeError("MultiValueOption takes a variable number of values; do not set nargs")
        if kwargs.get("is_flag") or kwargs.get("count"):
            raise TypeError("MultiValueOption cannot be a flag or a counter")
        # Commas are split after type conversion would have run, so only
        # strings make sense; convert afterwards (e.g. parse_int_list).
        if kwargs.get("type") not in (None, str, click.STRING):
            raise TypeError("MultiValueOption values are strings; convert them after parsing")
        kwargs["type"] = click.STRING
        kwargs["multiple"] = True
        kwargs.setdefault("metavar", "VALUE...")  # help shows it takes several
        default = kwargs.get("default")
        if isinstance(default, str):  # allow default="fp8,auto"
            kwargs["default"] = (default,)
        super().__init__(*args, **kwargs)
        self.split_commas = split_commas

    def _display_name(self) -> str:
        longs = [o for o in self.opts if o.startswith("--")]
        return (longs or list(self.opts))[0]

    def add_to_parser(self, parser: Any, ctx: click.Context) -> None:
        """Register as usual, then make our parser entries greedy."""
        super().add_to_parser(parser, ctx)
        wrapped: set[int] = set()
        for table in (getattr(parser, "_long_opt", {}), getattr(parser, "_short_opt", {})):
            for parser_opt in table.values():
                if parser_opt.obj is self and id(parser_opt) not in wrapped:
                    wrapped.add(id(parser_opt))
                    self._make_greedy(parser_opt, ctx)
        if not wrapped:  # click internals changed: fail loudly, not silently single-valued
            raise RuntimeError(
                f"MultiValueOption could not hook click {_click_version()} parser"
            )

    def _make_greedy(self, parser_opt: Any, ctx: click.Context) -> None:
        original = parser_opt.process
        name = self._display_name()

        def process(value: Any, state: Any) -> None:
            # click already took one token as the value, even one like
            # "--out"; treat that as "no value given".
            if isinstance(value, str) and _looks_like_option(value):
                raise click.BadOptionUsage(
                    name, f"Option '{name}' requires at least one value.", ctx=ctx
                )
            original(value, state)
            while state.rargs and not _looks_like_option(state.rargs[0]):
                original(state.rargs.pop(0), state)

        parser_opt.process = process

    def type_cast_value(self, ctx: click.Context, value: Any) -> Any:
        raw = super().type_cast_value(ctx, value)
        if not raw:
            return ()
        if self.split_commas:
            result = split_values(raw)
        else:
            result = _dedupe(v.strip() for v in raw if v.strip())
        if not result:  # e.g. "--kv=" or "--kv ,"
            raise click.BadParameter("needs at least one non-empty value.", ctx=ctx, param=self)
        return result


def _click_version() -> str:
    try:
        from importlib.metadata import version

        return version("click")
    except Exception:  # pragma: no cover - metadata missing
        return "?"


_INT_WITH_SUFFIX = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<suffix>[kKmM]?)$")
_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}


def _parse_one_int(text: str, name: str) -> int:
    cleaned = text.strip().replace("_", "")
    if _NEGATIVE_NUMBER.match(cleaned):
        raise click.BadParameter(f"{text!r} is negative: give a whole number of at least 1.", param_hint=[name])
    m = _INT_WITH_SUFFIX.match(cleaned)
    if not m:
        raise click.BadParameter(
            f"{text!r} is not a whole number (use e.g. 2048, 8k or 32K).", param_hint=[name]
        )
    number = float(m.group("num")) * _SUFFIX[m.group("suffix").lower()]
    if number != int(number):
        raise click.BadParameter(f"{text!r} is not a whole number of tokens.", param_hint=[name])
    if int(number) < 1:
        raise click.BadParameter(f"{text!r} must be at least 1.", param_hint=[name])
    return int(number)


def parse_int_list(values: Iterable[str], name: str) -> tuple[int, ...]:
    """Parse lengths such as ``("2048", "8k", "32K")`` -> ``(2048, 8192, 32768)``.

    ``k``/``K`` mean ×1024 and ``m``/``M`` ×1024² (token counts are powers
    of two in practice; note vLLM's own ``--max-model-len`` reads a lowercase
    ``k`` as ×1000).  Commas split, repeats are dropped.  Raises
    ``click.BadParameter`` naming ``name`` for non-integers and values < 1.
    """
    return tuple(dict.fromkeys(_parse_one_int(v, name) for v in split_values(values)))


def _parse_value(text: str) -> Any:
    """JSON when it parses (numbers, true/false/null, lists, dicts), else the string.

    Python spellings True/False/None are accepted too: left as strings, the
    string "False" would be truthy in vLLM's kwargs.
    """
    stripped = text.strip()
    python_literals = {"True": True, "False": False, "None": None}
    if stripped in python_literals:
        return python_literals[stripped]
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):
        return text


def parse_key_value(values: Iterable[str], name: str | None = None) -> dict[str, Any]:
    """Parse ``--engine-arg key=value`` items into vLLM ``LLM(**kwargs)``.

    Keys are stripped and ``-`` becomes ``_`` (``max-num-seqs`` ->
    ``max_num_seqs``) and must then be Python identifiers; later items win on
    repeated keys.  ``name`` (e.g. ``"--engine-arg"``) only labels errors.
    """
    if isinstance(values, str):
        values = [values]
    hint = [name] if name else None
    result: dict[str, Any] = {}
    for item in values:
        if "=" not in item:
            raise click.BadParameter(f"{item!r} is not of the form key=value.", param_hint=hint)
        key, _, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not key:
            raise click.BadParameter(
                f"{item!r} has an empty key (expected key=value).", param_hint=hint
            )
        if not key.isidentifier():
            raise click.BadParameter(
                f"{key!r} is not a valid keyword argument name.", param_hint=hint
            )
        result[key] = _parse_value(raw)
    return result


def parse_json_object(text: str | None, name: str) -> dict[str, Any] | None:
    """``'{"enable_thinking": false}'`` -> ``{"enable_thinking": False}``; None when not given.
    Raises ``ValueError`` with one line naming ``name`` for text that is not JSON or not a JSON object
    (the command prints it as its usage error, without click's usage lines)."""
    if text is None:
        return None
    example = 'e.g. \'{"enable_thinking": false}\''
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as error:
        reason = getattr(error, "msg", None) or type(error).__name__
        raise ValueError(f"{name} {text!r} is not JSON ({reason}); give a JSON object, {example}") from None
    if not isinstance(value, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
        raise ValueError(f"{name} {text!r} is {kind}, not a JSON object; give one, {example}")
    return value


def parse_float_list(values: Iterable[str] | None, name: str) -> tuple[float, ...] | None:
    """``("0.25", "0.5,0.9")`` -> ``(0.25, 0.5, 0.9)``; None/empty -> None (use the default).
    Raises ``click.BadParameter`` naming ``name`` for values that are not numbers."""
    if not values:
        return None
    parsed = []
    for value in split_values(values):
        try:
            number = float(value.rstrip("%")) / (100 if value.endswith("%") else 1)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not a number (e.g. 0.25 or 25%)", param_hint=name) from None
        if number != number or number in (float("inf"), float("-inf")):
            raise click.BadParameter(f"{value!r} is not a finite number", param_hint=name)
        parsed.append(number)
    return tuple(dict.fromkeys(parsed))
