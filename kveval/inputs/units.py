"""Byte sizes for options such as ``--kv-cache-memory 150MiB``.

vLLM's ``kv_cache_memory_bytes`` wants plain bytes; people think in MiB/GiB.
Binary multiples for KiB/MiB/GiB/TiB *and* bare K/M/G/T (the usual meaning
for memory budgets); decimal for KB/MB/GB/TB, as the SI prefixes say.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_size"]

_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "k": 1024,
    "ki": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gi": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "ti": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}

_SIZE = re.compile(r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*(?P<unit>[A-Za-z]*)$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text``: ``"150MiB"``, ``"1.5GiB"``, ``"200MB"``, ``"2G"``, ``"512k"``, ``"1024"``.

    Case-insensitive; spaces between number and unit are fine.  Fractions are
    rounded to whole bytes.  Raises ValueError for junk, negative or zero.
    """
    if isinstance(text, bool):  # bool is an int; True bytes is surely a bug
        raise ValueError(f"invalid size {text!r}")
    if isinstance(text, int):
        if text <= 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    raw = str(text)
    m = _SIZE.match(raw.strip().replace("_", ""))
    unit = m.group("unit").lower() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(
            f"invalid size {raw!r}: expected a number with an optional unit "
            "such as 1024, 512k, 150MiB, 1.5GiB, 200MB or 2G"
        )
    try:
        number = Decimal(m.group("num"))
    except InvalidOperation as exc:  # pragma: no cover - regex already checked
        raise ValueError(f"invalid size {raw!r}") from exc
    if number < 0:
        raise ValueError(f"size must be positive, got {raw!r}")
    size = int((number * _UNITS[unit]).to_integral_value())
    if size <= 0:
        raise ValueError(f"size must be positive, got {raw!r}")
    return size
