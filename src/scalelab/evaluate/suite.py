"""Every model evaluated alike: perplexity on the fixed validation windows, the offline zero-shot tasks, forward
throughput (timed on the perplexity's own forward passes) and peak memory, and lm-evaluation-harness when it can
run. One flat dict per model (DVC metrics)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from scalelab.config import EvaluateConfig
from scalelab.evaluate import lmeval
from scalelab.evaluate.lm import EvalLM
from scalelab.evaluate.perplexity import perplexity, throughput, val_windows
from scalelab.evaluate.zeroshot import run_tasks

SHARDS, VAL_TEXT = Path("data/tokens"), Path("data/prepared/val.parquet")
TOKENIZER = Path("data/tokenizer/tokenizer.json")


def val_documents(path: str | Path = VAL_TEXT) -> list[str]:
    """The validation split's documents (the prepare stage's parquet, column `text`)."""
    import polars as pl

    from scalelab.data import DataError

    if not Path(path).is_file():
        raise DataError(f"{path}: missing (run the prepare stage first)")
    return pl.read_parquet(path, columns=["text"])["text"].to_list()


def evaluate(lm: EvalLM, cfg: EvaluateConfig, *, seq_len: int, val_tokens: int, root: str | Path = ".") -> dict[str, Any]:
    root, start = Path(root), time.perf_counter()
    docs = val_documents(root / VAL_TEXT)
    batches, windows = val_windows(lm, shards_dir=root / SHARDS, val_text=docs, tokenizer_json=root / TOKENIZER,
                                   seq_len=seq_len, val_tokens=val_tokens, batch_size=cfg.batch_size)
    out: dict[str, Any] = {"model": lm.name, "path": lm.path, "kind": lm.kind, "params": lm.n_params,
                           "seq_len": int(batches[0][0].shape[1]), "windows": windows}
    times: list[float] = []  # each batch's forward: the throughput's samples, no passes of its own
    out |= perplexity(lm, batches, times)
    zs = cfg.zeroshot
    tasks = run_tasks(lm, docs, items=zs.items, choices=zs.choices, context_chars=zs.context_chars, seed=zs.seed,
                      batch_size=cfg.batch_size)
    for task, r in tasks.items():
        out |= {f"{task}_acc": r["acc"], f"{task}_stderr": r["stderr"]}
    out |= {"zeroshot_items": tasks["continuation"]["n"], "chance": tasks["continuation"]["chance"]}
    out |= throughput(lm, batches, cfg.throughput_batches, times)
    out["lm_eval"] = lmeval.run(lm.path, lm.kind, cfg.lm_eval.tasks, limit=cfg.lm_eval.limit, device=lm.device.type,
                                dtype=str(next(lm.module.parameters()).dtype).removeprefix("torch."),
                                batch_size=cfg.batch_size)
    out["wall_s"] = time.perf_counter() - start
    return out


def mlflow_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The numbers of one evaluation as MLflow metrics (`eval/...`), lm-eval's as `lm_eval/<task>/<metric>`."""
    keys = ("val_loss", "ppl", "bpb", "continuation_acc", "continuation_raw_acc", "cloze_acc", "tokens_per_s",
            "peak_mem_mb", "wall_s")
    out = {f"eval/{k}": result[k] for k in keys if k in result}
    for task, metrics in result.get("lm_eval", {}).get("results", {}).items():
        out |= {f"lm_eval/{task}/{k}": v for k, v in metrics.items()}
    return out
