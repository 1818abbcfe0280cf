"""SigmaScale run to convergence on real maps of SmolLM2-135M-Instruct (the study's SigmaScale part).

The whole-model SigmaScale cells do not fit this study's CPU time (README.md here), so SigmaScale is measured per map:
with the study's calibration (params.yaml here: seed 0, 16 × 128 train tokens), the paper's optimiser and cap (1000
steps) and the official plateau rule, on every map of the blocks given, at each kept fraction. Per map: steps, stop
reason, best/initial objective, the layer loss relative to SVD-LLM's optimum and to plain SVD's and ASVD's at the
same rank, and the effective rank before/after scaling. Writes sigmascale_maps.json next to this file.

    python results/compression-smollm2/sigmascale_maps.py [--blocks 0 15 29] [--keep 0.75]
"""

import argparse
import json
import time
from pathlib import Path

import torch

from scalelab.compress import methods
from scalelab.compress.calibrate import calibration_batches, collect, decoder_linears
from scalelab.compress.cells import streams
from scalelab.compress.erank import effective_rank
from scalelab.compress.rank import rank_for
from scalelab.compress.sigmascale import sigmascale
from scalelab.config import load_params
from scalelab.model.hf import load_causal_lm, load_hf_tokenizer

HERE = Path(__file__).parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default=str(HERE / "params.yaml"))
    ap.add_argument("--blocks", type=int, nargs="+", default=[0, 15, 29])
    ap.add_argument("--keep", type=float, nargs="+", default=[0.75])
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = load_params(args.params).compress
    location = cfg.source.location()
    tokenizer, model = load_hf_tokenizer(location), load_causal_lm(location, "float32")
    cal = cfg.calibration
    batches = calibration_batches(streams(cfg, tokenizer).train, samples=cal.samples, seq_len=cal.seq_len,
                                  batch_size=cal.batch_size, seed=0)
    blocks = decoder_linears(model)
    names = [n for b in args.blocks for n in blocks[b]]
    stats = collect(model, batches, names)
    out, start = [], time.perf_counter()
    for keep in args.keep:
        for name in names:
            w = model.get_submodule(name).weight.detach()
            m, n = w.shape
            k, gram = rank_for(m, n, keep), stats[name].gram
            t0 = time.perf_counter()
            f = sigmascale(w, k, gram, generator=torch.Generator().manual_seed(0), **cfg.sigmascale.model_dump())
            seconds = time.perf_counter() - t0
            best = methods.svd_llm_loss(w, k, gram)
            loss = {kind: methods.layer_loss(w, g.left, g.right, gram) for kind, g in (
                ("sigmascale", f), ("svd", methods.plain_svd(w, k)),
                ("asvd", methods.asvd(w, k, stats[name].abs_mean)))}
            row = {"name": name, "keep": keep, "m": m, "n": n, "rank": k, "seconds": seconds,
                   "ms_per_step": 1000 * seconds / f.info["steps"], **f.info,
                   "loss_rel_svd_llm": loss["sigmascale"] / best, "svd_rel_svd_llm": loss["svd"] / best,
                   "asvd_rel_svd_llm": loss["asvd"] / best,
                   "erank_before": effective_rank(torch.linalg.svdvals(w.double())),
                   "erank_after": effective_rank(f.sigma)}
            out.append(row)
            print(json.dumps(row), flush=True)
    (HERE / "sigmascale_maps.json").write_text(json.dumps({"params": args.params, "blocks": args.blocks,
                                                           "keep": args.keep, "wall_s": time.perf_counter() - start,
                                                           "maps": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
