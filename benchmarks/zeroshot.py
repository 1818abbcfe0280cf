"""Zero-shot scoring speed, all measured in this run on the same items:

1. shared contexts (each item's context computed once, its choices and other items' batched on the cached keys and
   values: `zeroshot.loglikelihoods(shared=True)`) against one full sequence per (context, choice) in batches of the
   same size (`shared=False`), and against the unbatched path (one sequence a forward): items/s of each, the best
   of `--rounds` interleaved rounds (other processes on the cores only ever slow a round down);
2. the scores of the three agree (max |Δ log p| over every choice; goal ≤ 1e-3 nats, float32 rounding);
3. the whole default zero-shot evaluation (`run_tasks` at params' evaluate.zeroshot, both tasks), timed once: the goal
   is ≤ 180 s for a 135M model on 2 cores (`--no-full` skips it).

    python benchmarks/zeroshot.py [--model HF_FOLDER] [--items 6] [--rounds 2] [--params params.yaml]

The model defaults to the pipeline's SmolLM2-135M-Instruct (models/smollm2-135m-instruct, the import_model stage's
out), imported from the packaged GGUF into a temporary folder when that stage has not run.

The validation documents are the prepare stage's (data/prepared/val.parquet) when built, else the params' corpus
prepared into a temporary folder, as the pipeline would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

import torch

from scalelab.config import load_params
from scalelab.data.corpus import prepare_corpus, read_prepared
from scalelab.evaluate import zeroshot
from scalelab.evaluate.lm import load_lm
from scalelab.evaluate.suite import VAL_TEXT, val_documents

DEFAULT = "smollm2-135m-instruct"


def documents(params) -> list[str]:
    if VAL_TEXT.is_file():
        return val_documents(VAL_TEXT)
    with tempfile.TemporaryDirectory() as tmp:
        prepare_corpus(params.prepare, tmp)
        return read_prepared(tmp, "val")


def timed(lm, items, batch_size: int, shared: bool) -> tuple[float, list]:
    start = time.perf_counter()
    scores = zeroshot.choice_scores(lm, items, batch_size, shared=shared)
    return time.perf_counter() - start, scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="a Hugging Face causal LM folder (default: SmolLM2-135M)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--items", type=int, default=6, help="items per task timed on the three paths")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-full", dest="full", action="store_false", help="skip timing the whole default run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    docs = documents(params)
    with contextlib.ExitStack() as stack:
        model = args.model or default_model(stack)
        run(args, params, load_lm(model, model.name, dtype=args.dtype), docs)


def default_model(stack: contextlib.ExitStack) -> Path:
    """The pipeline's SmolLM2 folder, else the packaged GGUF imported into a temporary one (removed at exit)."""
    built = Path("models") / DEFAULT
    if (built / "config.json").is_file():
        return built
    from scalelab.model.gguf import gguf_file, import_gguf

    out = Path(stack.enter_context(tempfile.TemporaryDirectory())) / DEFAULT
    import_gguf(gguf_file(DEFAULT), out)
    return out


def run(args, params, lm, docs) -> None:
    ev, zs = params.evaluate, params.evaluate.zeroshot
    items = (zeroshot.continuation_items(docs, args.items, zs.choices, zs.context_chars, zs.seed)
             + zeroshot.cloze_items(docs, args.items, zs.choices, zs.context_chars, zs.seed))
    zeroshot.choice_scores(lm, items[:2], ev.batch_size)  # warm-up: allocator, lazy init
    paths = {"shared": (ev.batch_size, True), "batched_full": (ev.batch_size, False), "unbatched": (1, False)}
    runs: dict[str, tuple[float, list]] = {}
    for _ in range(args.rounds):
        for k, (batch, shared) in paths.items():
            t, scores = timed(lm, items, batch, shared)
            runs[k] = min(runs.get(k, (t, scores)), (t, scores), key=lambda r: r[0])
    rate = {k: len(items) / t for k, (t, _) in runs.items()}
    ref = runs["unbatched"][1]
    diff = max(abs(a[0] - b[0]) for k in ("shared", "batched_full") for ra, rb in zip(runs[k][1], ref)
               for a, b in zip(ra, rb))
    print(json.dumps({"model": lm.name, "params": lm.n_params, "items_timed": len(items), "threads": args.threads,
                      "batch_size": ev.batch_size, "context_chars": zs.context_chars,
                      **{f"{k}_items_per_s": round(v, 3) for k, v in rate.items()}}))
    lines = [{"benchmark": "zeroshot", "metric": "shared_vs_unbatched_items_per_s",
              "value": round(rate["shared"] / rate["unbatched"], 3), "goal": ">= 2"},
             {"benchmark": "zeroshot", "metric": "shared_vs_batched_full_items_per_s",
              "value": round(rate["shared"] / rate["batched_full"], 3), "goal": ">= 1.5"},
             {"benchmark": "zeroshot", "metric": "max_abs_logp_diff", "value": diff, "goal": "<= 1e-3"},
             ]
    if args.full:
        start = time.perf_counter()
        tasks = zeroshot.run_tasks(lm, docs, items=zs.items, choices=zs.choices, context_chars=zs.context_chars,
                                   seed=zs.seed, batch_size=ev.batch_size)
        lines.append({"benchmark": "zeroshot", "metric": "default_zeroshot_s", "items": 2 * zs.items,
                      **{f"{t}_acc": r["acc"] for t, r in tasks.items()},
                      "value": round(time.perf_counter() - start, 1), "goal": "<= 180"})
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
