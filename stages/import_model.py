"""DVC stage `import_model@<name>` (one cell per entry of `import_models`): a packaged GGUF model, e.g.
SmolLM2-135M-Instruct, to models/<name> (an HF folder: safetensors, config, tokenizer), the real pretrained LM every
model-consuming phase can use offline. A profile that needs none (the tests' micro profile) lists none: no cell.

Outs: models/<name>, metrics/import_model/<name>.json (parameters, seconds).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params

def main(params: Params) -> None:
    from scalelab import tracking
    from scalelab.data import DataError, write_json_atomic
    from scalelab.model.gguf import GGUFNotFound, gguf_file, import_gguf

    name = sys.argv[1]
    if name not in params.import_models:
        raise DataError(f"import_model: {name!r} is not in import_models {params.import_models}")
    try:
        src = gguf_file(name)
    except GGUFNotFound as err:  # one line naming the install command, before any run is opened
        raise DataError(str(err)) from None
    out = Path("models") / name
    with tracking.stage_run(f"import_model@{name}", params={"model": name, "gguf": src.name},
                            experiment=params.tracking.experiment) as run:
        start = time.perf_counter()
        n = import_gguf(src, out)
        metrics = {"parameters": n, "seconds": round(time.perf_counter() - start, 2)}
        write_json_atomic(f"metrics/import_model/{name}.json", metrics)
        run.log_metrics(metrics)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="import_model"))
