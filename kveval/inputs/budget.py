"""`--budget`: how much more task evidence a run may gather, in rounds, before it stops undecided.

A sample count (`400`: paired task samples per tested cell, the first round's included), a time
(`90s`, `10m`, `1h`, `1.5h`: engine time of the extra rounds), or both (`600,20m`: whichever runs out
first); `0` or `off`: no rounds (one look, as before rounds existed). The sample cap is also the
design's N_max, over which the alpha is spent (analysis/sequential.py), so a time alone keeps the
default sample cap.

The default cap depends on where the cells run, decided once before the first look (`for_platform`): a
GPU scores a sample in milliseconds, so its default is 1200, where a healthy cell whose outputs loop 15 %
of the time PASSes 97-99 % of runs instead of 86-89 % at 600 (scripts/simulate_gate.py, docs/statistics.md).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

DEFAULT_SAMPLES = 600       # CPU: a healthy model's recovery bound clears 0.90 well before this (docs/statistics.md)
DEFAULT_SAMPLES_GPU = 1200  # GPU: enough for a healthy cell with 15 % looping outputs (module docstring)
DEFAULT_TEXT = "600,20m"

_TIME = re.compile(r"^(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>s|sec|m|min|h|hr)$", re.I)
_SECONDS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600}


@dataclass(frozen=True)
class Budget:
    """Paired task samples per tested cell (the design's N_max; 0: no rounds) and seconds of round time
    (None: no time cap)."""

    samples: int
    seconds: float | None
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


def for_platform(text: str | int | None, on_gpu: bool) -> str | int | None:
    """`--budget` as the run keeps it: on a GPU, no budget is 1200,20m and a time alone gets the 1200 cap;
    a sample count the user gave is theirs on every platform. Resolved once, at set-up, so the manifest,
    the rounds and a resume read the same design."""
    if not on_gpu:
        return text
    if text is None:
        return f"{DEFAULT_SAMPLES_GPU},20m"
    parsed = parse_budget(text)
    if parsed.samples and not any(part.strip().isdigit() for part in str(text).split(",")):
        return f"{DEFAULT_SAMPLES_GPU},{str(text).strip()}"
    return text


def parse_budget(text: str | int | None) -> Budget:
    """The budget `text` gives (None: the CPU default); ValueError with one line saying what is accepted."""
    if text is None:
        text = DEFAULT_TEXT
    if isinstance(text, bool):
        raise ValueError(f"--budget {text!r}: {_ACCEPTED}")
    raw = str(text).strip()
    if raw.lower() in ("0", "off", "none"):
        return Budget(0, None, raw)
    samples: int | None = None
    seconds: float | None = None
    for part in (p.strip() for p in raw.split(",")):
        if part.isdigit() and samples is None:
            samples = int(part)
            if samples < 1:
                raise ValueError(f"--budget {raw!r}: a sample count of 0 turns rounds off; write 0 or off alone")
            continue
        match = _TIME.match(part)
        if match and seconds is None:
            seconds = float(match.group("num")) * _SECONDS[match.group("unit").lower()]
            if seconds <= 0:
                raise ValueError(f"--budget {raw!r}: a time must be more than 0")
            continue
        raise ValueError(f"--budget {raw!r}: {_ACCEPTED}")
    return Budget(samples if samples is not None else DEFAULT_SAMPLES, seconds, raw)


_ACCEPTED = ("give paired task samples per cell (e.g. 400), a time (90s, 10m, 1h), both (600,20m), "
             "or 0 / off for no extra rounds")
