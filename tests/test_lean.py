"""scalelab.train's import path without the optional backends its libraries drag in (scalelab.train.lean): a cold
training stage imports neither transformers, scipy nor matplotlib, and the availability checks answer truly once the
imports are done. tests/test_cells.py checks torchmetrics' part alone, through a Trainer."""

import json
import os
import subprocess
import sys

import pytest

PROBE = """\
import importlib.util, json, sys
import scalelab.train
from pytorch_optimizer.base import compatibility

print(json.dumps({"heavy": sorted(m for m in ("transformers", "scipy", "matplotlib") if m in sys.modules),
                  "restored": importlib.util.find_spec("transformers") is not None,
                  "bound_meanwhile": compatibility.find_spec("transformers") is not None}))
"""


@pytest.mark.parametrize("lean", ["1", "0"])
def test_a_training_process_imports_none_of_the_hidden_packages(lean):
    """With SCALELAB_LEAN_IMPORTS=0 (the control) the same import pulls all three in: they are installed and reached.
    Lean, pytorch-optimizer's own find_spec (bound while it loaded) and importlib's answer truly afterwards."""
    env = {**os.environ, "SCALELAB_LEAN_IMPORTS": lean, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen["heavy"] == ([] if lean == "1" else ["matplotlib", "scipy", "transformers"]), seen
    assert seen["restored"] and seen["bound_meanwhile"], seen
