"""lm-evaluation-harness (0.4.13) on a Hugging Face export, as an optional extra.

Never part of a result unless it really ran: not installed, no tasks asked for, a non-HF model, or task data that is
not on disk (offline, nothing downloads at run time) each give `{"skipped": "<why>"}` and the stage goes on.
Install with `pip install 'scalelab[eval]'`; fetch the task data once online (e.g. a first run without
HF_DATASETS_OFFLINE) so later offline runs find it in the Hugging Face cache.
"""

from __future__ import annotations

import importlib.util
from typing import Any

INSTALL_HINT = "pip install 'scalelab[eval]'"


def run(path: str, kind: str, tasks: list[str], *, limit: int | None, device: str, dtype: str,
        batch_size: int) -> dict[str, Any]:
    """{"results": {task: {metric: value}}} or {"skipped": reason}."""
    if not tasks:
        return {"skipped": "no tasks (evaluate.lm_eval.tasks is empty)"}
    if importlib.util.find_spec("lm_eval") is None:
        return {"skipped": f"lm-eval is not installed ({INSTALL_HINT})"}
    if not kind.startswith("hf:"):
        return {"skipped": f"lm-eval takes Hugging Face models; this one is {kind!r}"}
    try:
        import lm_eval

        out = lm_eval.simple_evaluate(
            model="hf", model_args=f"pretrained={path},dtype={dtype},trust_remote_code=False",
            tasks=list(tasks), limit=limit, device=device, batch_size=batch_size, log_samples=False)
    except Exception as err:  # offline without cached task data, an unknown task name, ...
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
        return {"skipped": f"lm-eval could not run {tasks} ({type(err).__name__}: {first}); offline, its task data "
                           "must already be in the Hugging Face cache"}
    results = {task: {k.replace(",none", ""): float(v) for k, v in metrics.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool)}
               for task, metrics in (out or {}).get("results", {}).items()}
    return {"results": results}
