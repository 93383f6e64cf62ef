"""The CPU demo run directory as kveval wrote it before issue 9 (cells included), unpacked once per session."""
from __future__ import annotations

import functools
import tarfile
import tempfile
from pathlib import Path

ARCHIVE = Path(__file__).resolve().parents[1] / "golden" / "cpu-demo-before-issue-9.tar.gz"


@functools.lru_cache(maxsize=1)
def old_cpu_demo() -> Path:
    """A read-only reference: copy it before writing into it."""
    target = Path(tempfile.mkdtemp(prefix="kveval-golden-"))
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(target, filter="data")
    return target / "cpu-demo"
