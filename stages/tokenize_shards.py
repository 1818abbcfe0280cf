"""DVC stage `tokenize`: encode both splits into flat token shards (EOT between documents) with a meta.json holding
each shard's size and sha256, which the loader verifies.

Named tokenize_shards.py: a stages/tokenize.py would shadow the standard library's `tokenize` module in every stage
script (Python puts the script's folder first on sys.path), breaking all of them.

Outs: data/tokens/{train.bin, val.bin, meta.json, mlflow_run.json}, metrics/tokenize.json.
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
    from scalelab.data import (atomic_dir, eot_id, file_sha256, load_tokenizer, prepared_texts, tokenize_splits,
                               write_json_atomic)

    prepared, tok_path, out = Path("data/prepared"), Path("data/tokenizer/tokenizer.json"), Path("data/tokens")
    logged = {**params.tokenize.model_dump(mode="json"), "eot_token": params.tokenizer.eot_token}
    with tracking.stage_run("tokenize", params=logged,
                            experiment=params.tracking.experiment, deps=[str(prepared), str(tok_path)]) as run:
        tok = load_tokenizer(tok_path)
        splits = {name: prepared_texts(prepared, name, params.tokenize.batch_size)  # streamed: bounded memory
                  for name in ("train", "val")}
        start = time.perf_counter()
        with atomic_dir(out) as tmp:
            meta = tokenize_splits(tok, splits, tmp, eot_id=eot_id(tok, params.tokenizer.eot_token),
                                   batch_size=params.tokenize.batch_size, tokenizer_sha256=file_sha256(tok_path))
        seconds = time.perf_counter() - start
        n_bytes = sum(s["text_bytes"] for s in meta["shards"].values())
        metrics = {**{name: {"tokens": s["tokens"], "bytes": s["bytes"]} for name, s in meta["shards"].items()},
                   "seconds": round(seconds, 3), "text_mb_per_s": round(n_bytes / 1e6 / seconds, 3)}
        write_json_atomic("metrics/tokenize.json", metrics)
        run.log_metrics(tracking.flatten(metrics))
        run.record(out)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="tokenize"))
