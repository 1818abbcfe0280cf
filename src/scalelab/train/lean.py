"""Import Lightning and the optimizer library without the optional backends they drag in (a cell's cost outside its
compute).

Lightning imports torchmetrics unconditionally (it compares its version by importing it), and torchmetrics' package
init imports every optional backend it finds installed: `transformers` (BERTScore, InfoLM), `scipy.signal` (audio
metrics) and `matplotlib` (metric plots). pytorch-optimizer (scalelab.optim's library) imports `transformers` whenever
it is installed, for one helper of one optimizer scalelab does not use (LOMO's DeepSpeed ZeRO-3 check). In this venv
they are installed for other stages, and in a training process they were ~40% of its start-up (`python -X
importtime`), for code scalelab never runs.

`import_lightning()` imports torchmetrics first while its availability checks (lightning_utilities' `package_available`
and `RequirementCache`, evaluated by torchmetrics' modules as they load) report those packages absent, so torchmetrics
defines its fallbacks instead of importing them; then pytorch-optimizer while `importlib.util.find_spec` (its checks)
reports them absent; then Lightning. Only checks evaluated during those imports are affected: anything asked later
(Lightning's own checks, other libraries) sees the real environment. The cost: in a process that imported
scalelab.train, torchmetrics' BERTScore/audio/plot helpers report their backend missing, and pytorch-optimizer's
`is_deepspeed_zero3_enabled` answers False (no DeepSpeed here either). SCALELAB_LEAN_IMPORTS=0 turns this off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from scalelab.runtime.log import quiet_lightning

HIDDEN = frozenset({"transformers", "scipy", "matplotlib"})


@contextlib.contextmanager
def _hidden_from_find_spec(hidden: frozenset[str]) -> Iterator[None]:
    """importlib.util.find_spec reports the `hidden` packages absent meanwhile (pytorch-optimizer asks as it loads)."""
    import importlib.util

    real, live = importlib.util.find_spec, [True]

    def find_spec(name: str, package: str | None = None):
        # `live`: a module that bound this function meanwhile (`from importlib.util import find_spec`, as
        # pytorch-optimizer's do) and asks later gets the real answer
        return None if live[0] and name.split(".")[0] in hidden else real(name, package)

    importlib.util.find_spec = find_spec
    try:
        yield
    finally:
        importlib.util.find_spec, live[0] = real, False


@contextlib.contextmanager
def _hidden_from_torchmetrics(hidden: frozenset[str]) -> Iterator[None]:
    import lightning_utilities.core.imports as lu

    real_available, real_check, live = lu.package_available, lu.RequirementCache._check_requirement, [True]

    def package_available(name: str) -> bool:  # `live`: as in _hidden_from_find_spec
        return not (live[0] and name.split(".")[0] in hidden) and real_available(name)

    def check_requirement(self) -> None:
        from packaging.requirements import Requirement

        if Requirement(self.requirement).name in hidden:
            self.available, self.message = False, f"{self.requirement!r} hidden by scalelab.train.lean"
        else:
            real_check(self)

    lu.package_available, lu.RequirementCache._check_requirement = package_available, check_requirement
    try:
        yield
    finally:
        lu.package_available, lu.RequirementCache._check_requirement, live[0] = real_available, real_check, False


def import_lightning() -> None:
    """Import torchmetrics and pytorch-optimizer lean (each unless already imported, or SCALELAB_LEAN_IMPORTS=0), then
    Lightning, and silence Lightning's start-up INFO (scalelab.runtime.log)."""
    if os.environ.get("SCALELAB_LEAN_IMPORTS", "1") != "0":
        if "torchmetrics" not in sys.modules:
            with _hidden_from_torchmetrics(HIDDEN):
                import torchmetrics  # noqa: F401
        if "pytorch_optimizer" not in sys.modules:
            with _hidden_from_find_spec(HIDDEN):
                import pytorch_optimizer  # noqa: F401
    import lightning.pytorch  # noqa: F401

    quiet_lightning()
