"""DVC stage `tokenizer`: train a byte-level BPE on the train split (or take a tokenizer.json from a file or the hub).

Outs: data/tokenizer/tokenizer.json (+ mlflow_run.json), metrics/tokenizer.json (vocab size, train seconds,
bytes per token on val).
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
    from scalelab.data import (atomic_dir, build_tokenizer, bytes_per_token, count_prepared, eot_id, prepared_texts,
                               write_json_atomic)

    cfg, prepared, out = params.tokenizer, Path("data/prepared"), Path("data/tokenizer")
    deps = [str(prepared / "train.parquet"), str(prepared / "val.parquet"), *([cfg.path] if cfg.kind == "file" else [])]
    with tracking.stage_run("tokenizer", params=cfg.model_dump(mode="json"),
                            experiment=params.tracking.experiment, deps=deps) as run:
        start = time.perf_counter()
        tok = build_tokenizer(cfg, prepared_texts(prepared, "train"), length=count_prepared(prepared, "train"))
        seconds = time.perf_counter() - start
        with atomic_dir(out) as tmp:
            tok.save(str(tmp / "tokenizer.json"))
        metrics = {"vocab_size": tok.get_vocab_size(with_added_tokens=True), "eot_id": eot_id(tok, cfg.eot_token),
                   "train_seconds": round(seconds, 3),
                   "val_bytes_per_token": round(bytes_per_token(tok, prepared_texts(prepared, "val")), 4)}
        write_json_atomic("metrics/tokenizer.json", metrics)
        run.log_metrics(tracking.flatten(metrics))
        run.record(out)


if __name__ == "__main__":
    sys.exit(stage_main(main, name="tokenizer"))
