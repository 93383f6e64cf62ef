"""Leaves a mark when a Python process that has this folder first on PYTHONPATH imports lm-eval: the file
$KVEVAL_TEST_LM_EVAL_MARK is created, then the import goes on as usual. Shows that a waiting cell process or
a fork server for a run without a tasks phase does not import lm-eval ahead (8 s on the 2-core CPU)."""
import os
import sys


class _MarkLmEval:
    def find_spec(self, name, path=None, target=None):
        if name == "lm_eval":
            open(os.environ["KVEVAL_TEST_LM_EVAL_MARK"], "a").close()
        return None   # found by the next finder, as without this one


sys.meta_path.insert(0, _MarkLmEval())
