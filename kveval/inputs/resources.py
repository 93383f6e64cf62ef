"""Where the files shipped inside the package are: the prompt corpus and the lm-eval task YAMLs.

Read through importlib.resources so an installed wheel finds them as well as a checkout does
(the repository's top-level data/ and tasks/ are links to these folders).
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

# pip installs wheels unpacked, so the package's resources are plain directories.
DATA_DIR = Path(str(files("kveval.inputs") / "data"))
LM_EVAL_TASKS_DIR = Path(str(files("kveval.inputs") / "lm_eval_tasks"))  # YAMLs + utils.py for --include_path
