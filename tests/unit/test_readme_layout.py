"""The README's layout section names every module of the package (and nothing that is gone)."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout\n"):]
    return section[section.index("```\n") + 4:section.index("\n```", section.index("```\n") + 4)]


def test_layout_names_every_module():
    block = _layout_block()
    modules = [p.relative_to(ROOT / "kveval").as_posix() for p in sorted((ROOT / "kveval").rglob("*.py"))
               if p.name != "__init__.py" or p.parent == ROOT / "kveval"]
    missing = [m for m in modules if m not in block and not (m.startswith("worker/phases/") or
                                                              m.startswith("inputs/lm_eval_tasks/"))]
    assert not missing, f"README layout lacks {missing}"


def test_layout_names_nothing_that_is_gone():
    named = re.findall(r"^\s+([\w/]+\.py)\b", _layout_block(), flags=re.M)
    gone = [name for name in named if not (ROOT / "kveval" / name).is_file()]
    assert named and not gone, f"README layout names missing modules {gone}"
