"""A 135M model evaluated end to end, and zero-shot scoring's paths, all measured in this run:

1. the whole evaluation of the pipeline's evaluate stage (`scalelab.evaluate.suite.evaluate` at params' evaluate
   section: perplexity on the validation windows, both zero-shot tasks, throughput), the model's loading included,
   timed once on `--threads` (default 2): the goal is <= 180 s for SmolLM2-135M on 2 cores (`--no-full` skips it);
2. zero-shot on `--items` items per task three ways: shared contexts (each context computed once with its choices as
   a prefix tree in one row, `zeroshot.loglikelihoods(shared=True)`), one full sequence per (context, choice) in
   batches of the same size (`shared=False`), and unbatched (one sequence a forward): items/s of each, the best of
   `--rounds` interleaved rounds (other processes on the cores only ever slow a round down);
3. the scores of the three agree (max |Δ log p| over every choice; goal <= 1e-3 nats, float32 rounding).

    python benchmarks/zeroshot.py [--model HF_FOLDER] [--threads 2] [--items 6] [--rounds 2] [--params params.yaml]

The model defaults to the pipeline's SmolLM2-135M-Instruct (models/smollm2-135m-instruct, the import_model stage's
out), imported from the packaged GGUF into a temporary folder when that stage has not run. The data (the validation
split, the project's tokenizer, the token shards) are the pipeline's when its data stages have run, else built by
`dvc repro tokenize` in a temporary copy of the project, as the pipeline would.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from workspace import workspace_copy  # noqa: E402  (the tests' copy of the code in a fresh git repo)

from scalelab.config import load_params  # noqa: E402
from scalelab.evaluate import suite, zeroshot  # noqa: E402
from scalelab.evaluate.lm import load_lm  # noqa: E402

DEFAULT = "smollm2-135m-instruct"
GOAL_S = 180  # a 135M model's whole evaluation on 2 cores


def project_data(params: Path, stack: contextlib.ExitStack) -> Path:
    """The root whose data/ the evaluation reads: this project's when its data stages have run, else a temporary
    copy of the project where `dvc repro tokenize` builds them."""
    if all((ROOT / p).exists() for p in (suite.VAL_TEXT, suite.TOKENIZER, suite.SHARDS / "meta.json")):
        return ROOT
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zeroshot-bench-")))
    env = workspace_copy(tmp, params)
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "dvc", "repro", "tokenize"], cwd=tmp, env=env, capture_output=True,
                         text=True)
    if res.returncode:
        sys.exit(f"dvc repro tokenize failed in a copy of the project:\n{(res.stdout + res.stderr)[-3000:]}")
    print(f"data stages built in {tmp} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    return tmp


def default_model(stack: contextlib.ExitStack) -> Path:
    """The pipeline's SmolLM2 folder, else the packaged GGUF imported into a temporary one (removed at exit)."""
    built = ROOT / "models" / DEFAULT
    if (built / "config.json").is_file():
        return built
    from scalelab.model.gguf import gguf_file, import_gguf

    out = Path(stack.enter_context(tempfile.TemporaryDirectory())) / DEFAULT
    import_gguf(gguf_file(DEFAULT), out)
    return out


def end_to_end(args, params, model: Path, root: Path) -> dict:
    """The evaluate stage's work on `model`: load it, then the suite at params' evaluate section."""
    ev = params.evaluate
    start, cpu = time.perf_counter(), time.process_time()
    lm = load_lm(model, model.name, dtype=args.dtype, tokenizer_fallback=root / suite.TOKENIZER)
    loaded = time.perf_counter() - start
    r = suite.evaluate(lm, ev, seq_len=ev.seq_len or params.pretrain.seq_len,
                       val_tokens=ev.val_tokens or params.pretrain.val_tokens, root=root)
    return {"benchmark": "zeroshot", "metric": "evaluation_end_to_end_s", "model": lm.name, "params": lm.n_params,
            "threads": args.threads, "load_s": round(loaded, 1), "cpu_s": round(time.process_time() - cpu, 1),
            **{k: r[k] for k in ("windows", "val_tokens", "val_loss", "bpb", "zeroshot_items", "continuation_acc",
                                 "continuation_raw_acc", "cloze_acc", "tokens_per_s")},
            "value": round(time.perf_counter() - start, 1), "goal": f"<= {GOAL_S} on 2 threads"}


def paths(args, params, lm, docs) -> list[dict]:
    ev, zs = params.evaluate, params.evaluate.zeroshot
    items = (zeroshot.continuation_items(docs, args.items, zs.choices, zs.context_chars, zs.seed)
             + zeroshot.cloze_items(docs, args.items, zs.choices, zs.context_chars, zs.seed))
    if lm.masked is None:
        sys.exit(f"{lm.name} ({lm.kind}): no masked forward, so no shared-context path to measure")
    zeroshot.choice_scores(lm, items[:2], ev.batch_size)  # warm-up: allocator, lazy init
    modes = {"shared": (ev.batch_size, True), "batched_full": (ev.batch_size, False), "unbatched": (1, False)}
    runs: dict[str, tuple[float, list]] = {}
    for _ in range(args.rounds):
        for k, (batch, shared) in modes.items():
            start = time.perf_counter()
            scores = zeroshot.choice_scores(lm, items, batch, shared=shared)
            t = time.perf_counter() - start
            runs[k] = min(runs.get(k, (t, scores)), (t, scores), key=lambda r: r[0])
    rate = {k: len(items) / t for k, (t, _) in runs.items()}
    ref = runs["unbatched"][1]
    diff = max(abs(a[0] - b[0]) for k in ("shared", "batched_full") for ra, rb in zip(runs[k][1], ref)
               for a, b in zip(ra, rb))
    print(json.dumps({"model": lm.name, "params": lm.n_params, "items_timed": len(items), "threads": args.threads,
                      "batch_size": ev.batch_size, "context_chars": zs.context_chars,
                      **{f"{k}_items_per_s": round(v, 3) for k, v in rate.items()}}))
    return [{"benchmark": "zeroshot", "metric": "shared_vs_unbatched_items_per_s",
             "value": round(rate["shared"] / rate["unbatched"], 3), "goal": ">= 2"},
            {"benchmark": "zeroshot", "metric": "shared_vs_batched_full_items_per_s",
             "value": round(rate["shared"] / rate["batched_full"], 3), "goal": ">= 1.5"},
            {"benchmark": "zeroshot", "metric": "max_abs_logp_diff", "value": diff, "goal": "<= 1e-3"}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="a Hugging Face causal LM folder (default: SmolLM2-135M)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--items", type=int, default=6, help="items per task timed on the three paths")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-full", dest="full", action="store_false", help="skip the whole evaluation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    params = load_params(args.params)
    with contextlib.ExitStack() as stack:
        root, model = project_data(args.params.resolve(), stack), args.model or default_model(stack)
        lines = [end_to_end(args, params, model, root)] if args.full else []  # first: nothing else warmed it up
        lm = load_lm(model, model.name, dtype=args.dtype)
        lines += paths(args, params, lm, suite.val_documents(root / suite.VAL_TEXT))
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
