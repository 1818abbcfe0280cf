"""Import Lightning without the optional backends torchmetrics drags in (a cell's cost outside its compute).

Lightning imports torchmetrics unconditionally (it compares its version by importing it), and torchmetrics' package
init imports every optional backend it finds installed: `transformers` (BERTScore, InfoLM), `scipy.signal` (audio
metrics) and `matplotlib` (metric plots). In this venv they are installed for other stages, and in a training process
they were ~40% of its start-up (`python -X importtime`), for metrics scalelab never uses.

`import_lightning()` imports torchmetrics first while its availability checks (lightning_utilities' `package_available`
and `RequirementCache`, evaluated by torchmetrics' modules as they load) report those packages absent, so torchmetrics
defines its fallbacks instead of importing them; then it imports Lightning. Only checks evaluated during that import
are affected: anything asked later (Lightning's own checks, other libraries) sees the real environment. The cost: in a
process that imported scalelab.train, torchmetrics' BERTScore/audio/plot helpers report their backend missing.
SCALELAB_LEAN_IMPORTS=0 turns this off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

from scalelab.runtime.log import quiet_lightning

HIDDEN = frozenset({"transformers", "scipy", "matplotlib"})


@contextlib.contextmanager
def _hidden_from_torchmetrics(hidden: frozenset[str]) -> Iterator[None]:
    import lightning_utilities.core.imports as lu

    real_available, real_check = lu.package_available, lu.RequirementCache._check_requirement

    def package_available(name: str) -> bool:
        return name.split(".")[0] not in hidden and real_available(name)

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
        lu.package_available, lu.RequirementCache._check_requirement = real_available, real_check


def import_lightning() -> None:
    """Import torchmetrics lean (unless it is already imported, or SCALELAB_LEAN_IMPORTS=0), then Lightning, and
    silence Lightning's start-up INFO (scalelab.runtime.log)."""
    if "torchmetrics" not in sys.modules and os.environ.get("SCALELAB_LEAN_IMPORTS", "1") != "0":
        with _hidden_from_torchmetrics(HIDDEN):
            import torchmetrics  # noqa: F401
    import lightning.pytorch  # noqa: F401

    quiet_lightning()
