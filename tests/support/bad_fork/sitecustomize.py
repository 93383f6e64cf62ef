"""Makes every fork of a Python process that has this folder first on PYTHONPATH look "bad" to kveval's fork
server (worker/cell_main._fork_is_safe), as on a host where an import initialised CUDA before the fork: a
stand-in `torch` whose `cuda._is_in_bad_fork()` is True. Only for processes that import no real torch (the
fake engine's)."""
import sys
import types

_torch = types.ModuleType("torch")
_torch.cuda = types.SimpleNamespace(_is_in_bad_fork=lambda: True)
sys.modules.setdefault("torch", _torch)
