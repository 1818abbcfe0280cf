"""DVC stage `import_model`: SmolLM2-135M-Instruct from its packaged GGUF to models/smollm2-135m-instruct (an HF
folder: safetensors, config, tokenizer), the real pretrained LM every model-consuming phase can use offline.

Outs: models/smollm2-135m-instruct, metrics/import_model.json (parameters, seconds).
"""

import sys
import time
from pathlib import Path

from scalelab.config import Params
from scalelab.pipeline.stage import stage_main

NAME = "smollm2-135m-instruct"


def main(params: Params) -> None:
    from scalelab import tracking
    from scalelab.data import write_json_atomic
    from scalelab.model.gguf import gguf_file, import_gguf

    src, out = gguf_file(NAME), Path("models") / NAME
    with tracking.stage_run("import_model", params={"model": NAME, "gguf": src.name},
                            experiment=params.tracking.experiment) as run:
        start = time.perf_counter()
        n = import_gguf(src, out)
        metrics = {"parameters": n, "seconds": round(time.perf_counter() - start, 2)}
        write_json_atomic("metrics/import_model.json", metrics)
        run.log_metrics(metrics)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="import_model"))
