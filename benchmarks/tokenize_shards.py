"""Benchmark: the tokenize stage's library path (scalelab.data.tokenize_splits: encode, join with EOT, write shards
with sha256) against raw `Tokenizer.encode_batch_fast` on the same text, in the same run.

    python benchmarks/tokenize_shards.py [--repeats 5]

(Not benchmarks/tokenize.py: that name would shadow the standard library's `tokenize` module for every script in
benchmarks/.)

Uses data/prepared and data/tokenizer when the pipeline has built them, else prepares the default corpus in memory
and trains the default tokenizer. Every timed call gets a fresh tokenizer (BPE caches words as it encodes). Each
repeat times both sides back to back (alternating which goes first) and the ratio is the median of the per-repeat
ratios, which cancels most of the noise from other load on the machine. Goal: the stage runs at >= 0.8x raw speed.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time

from tokenizers import Tokenizer

from scalelab import project_root, tracking
from scalelab.config import PrepareConfig, TokenizeConfig, TokenizerConfig
from scalelab.data import build_tokenizer, eot_id, prepare_corpus, read_prepared, tokenize_splits


def corpus_and_tokenizer() -> tuple[dict[str, list[str]], str, str]:
    root = project_root() / "data"
    if (root / "prepared/val.parquet").is_file() and (root / "tokenizer/tokenizer.json").is_file():
        splits = {name: read_prepared(root / "prepared", name) for name in ("train", "val")}
        return splits, (root / "tokenizer/tokenizer.json").read_text(), "data/prepared + data/tokenizer"
    with tempfile.TemporaryDirectory() as prepared:
        prepare_corpus(PrepareConfig(), prepared)
        splits = {name: read_prepared(prepared, name) for name in ("train", "val")}
    return splits, build_tokenizer(TokenizerConfig(), splits["train"]).to_str(), "default corpus, fresh BPE"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    splits, tok_json, source = corpus_and_tokenizer()
    batch_size, eot = TokenizeConfig().batch_size, eot_id(Tokenizer.from_str(tok_json), TokenizerConfig().eot_token)
    n_bytes = sum(len(t.encode()) for texts in splits.values() for t in texts)

    def raw() -> None:
        tok = Tokenizer.from_str(tok_json)
        for texts in splits.values():
            for i in range(0, len(texts), batch_size):
                tok.encode_batch_fast(texts[i : i + batch_size], add_special_tokens=False)

    def stage() -> None:
        with tempfile.TemporaryDirectory() as out:
            tokenize_splits(Tokenizer.from_str(tok_json), splits, out, eot_id=eot, batch_size=batch_size,
                            tokenizer_sha256="bench")

    times: dict[str, list[float]] = {"encode_batch_fast (raw)": [], "tokenize_splits (stage)": []}
    cpu = {name: [] for name in times}  # CPU seconds of all threads: the work done, whatever else loads the machine
    for r in range(args.repeats):
        for name, fn in sorted(zip(times, (raw, stage)), reverse=r % 2 == 1):  # alternate which goes first
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = statistics.median(r / s for r, s in zip(*times.values()))

    print(f"corpus: {source}; {n_bytes / 1e6:.2f} MB, batch_size {batch_size}, {args.repeats} repeats")
    print(f"{'path':<26}{'median s':>10}{'best s':>10}{'MB/s':>8}{'CPU s':>8}")
    for name, t in times.items():
        print(f"{name:<26}{med[name]:>10.3f}{min(t):>10.3f}{n_bytes / 1e6 / med[name]:>8.2f}"
              f"{statistics.median(cpu[name]):>8.2f}")
    print(f"ratio raw / stage (median of per-repeat ratios): {ratio:.3f}")
    with tracking.stage_run("bench.tokenize", params={"repeats": args.repeats, "batch_size": batch_size,
                                                      "source": source}, experiment="scalelab-benchmarks") as run:
        run.log_metrics({"throughput_ratio_vs_encode_batch_fast": ratio,
                         "stage_mb_per_s": n_bytes / 1e6 / med["tokenize_splits (stage)"]})
    print(json.dumps({"benchmark": "tokenize", "metric": "throughput_ratio_vs_encode_batch_fast",
                      "value": round(ratio, 3), "goal": ">= 0.8"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
