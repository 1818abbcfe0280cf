"""SigmaScale's optimisation step, fast against full (docs/compression.md), in this run:

the same map, the same initial scalings and the same AdamW steps, once with the loss the optimiser uses
(`scaled_loss`: eigendecomposition of the small Gram of D_r W D_c, residual energy) and once with the paper's form
(`svd_loss`: full differentiable SVD, ‖(W − Ŵ)S‖² through the calibration root S), both float32 as the optimiser runs.
Reported: the mean wall time of one step (forward and backward) of each, their ratio (goal ≥ 5), and the two runs'
final losses, which must agree (goal: relative difference < 1e-3; both are the same function, so any gap is the
fast form's float32 error against the full form's cancellation).

The map is the down projection (576 × 1536) of SmolLM2-135M's first block with its calibration statistics when the
model is at compress.source (random token windows), else a random 576 × 1536 matrix with anisotropic inputs.

    python benchmarks/compress.py [--params params.yaml] [--steps 30] [--keep 0.75] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from scalelab.compress import calibration_batches, collect, rank_for
from scalelab.compress.methods import whitening
from scalelab.compress.sigmascale import problem_of, scaled_loss, svd_loss
from scalelab.config import load_params


def the_map(params) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(W, C = XXᵀ, description): a real 576 × 1536 map and its calibration Gram, or a random stand-in."""
    location = params.compress.source.location()
    if Path(location, "config.json").is_file():
        import numpy as np

        from scalelab.model.hf import load_causal_lm

        model = load_causal_lm(location)
        names = [n for n, m in model.named_modules() if n.endswith("layers.0.mlp.down_proj")]
        if names:
            vocab = model.get_input_embeddings().num_embeddings
            tokens = np.random.default_rng(0).integers(0, vocab, 100_000)
            batches = calibration_batches(tokens, samples=16, seq_len=128, batch_size=8, seed=0)
            stats = collect(model, batches, names)[names[0]]
            return model.get_submodule(names[0]).weight.detach().float(), stats.gram, f"{location}: {names[0]}"
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1536, 4096, generator=g, dtype=torch.float64) * torch.rand(1536, 1, generator=g,
                                                                                  dtype=torch.float64).mul(3).exp()
    return torch.randn(576, 1536, generator=g) / 40, x @ x.T, "random 576 × 1536 map, anisotropic inputs"


def run(loss_fn, m: int, n: int, steps: int) -> tuple[float, float]:
    """(mean seconds per step, final loss) of `steps` AdamW steps from the paper's initialisation."""
    g = torch.Generator().manual_seed(0)
    d_r = torch.nn.Parameter(torch.randn(m, generator=g) * 0.1 * 0.02)
    d_c = torch.nn.Parameter(torch.randn(n, generator=g) * 0.1 * 0.02)
    opt = torch.optim.AdamW([d_r, d_c], lr=5e-3, weight_decay=0.0)
    loss_fn(d_r, d_c).backward()  # warm-up (allocations, LAPACK workspaces): not timed
    opt.zero_grad()
    start = time.perf_counter()
    for _ in range(steps):
        loss = loss_fn(d_r, d_c)
        opt.zero_grad()
        loss.backward()
        opt.step()
    seconds = (time.perf_counter() - start) / steps
    with torch.no_grad():
        return seconds, float(loss_fn(d_r, d_c))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--keep", type=float, default=0.75)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    weight, gram, what = the_map(load_params(args.params))
    m, n = weight.shape
    k = rank_for(m, n, args.keep)
    problem = problem_of(weight, gram)
    root, _ = whitening(gram)
    w32, root32 = weight.float(), root.float()
    fast_s, fast_loss = run(lambda a, b: scaled_loss(a, b, problem, k), m, n, args.steps)
    full_s, full_loss = run(lambda a, b: svd_loss(a, b, w32, root32, k), m, n, args.steps)
    print(f"map: {what} ({m} × {n}), rank {k} (kept fraction {args.keep}), {args.steps} steps, "
          f"{args.threads} thread(s)")
    print(f"full differentiable SVD: {1000 * full_s:.1f} ms/step, final loss {full_loss:.6g}")
    print(f"fast (eigh of the small Gram): {1000 * fast_s:.1f} ms/step, final loss {fast_loss:.6g}")
    for line in ({"benchmark": "compress", "metric": "sigmascale_step_speedup", "value": full_s / fast_s,
                  "goal": ">= 5"},
                 {"benchmark": "compress", "metric": "sigmascale_final_loss_rel_diff",
                  "value": abs(fast_loss - full_loss) / abs(full_loss), "goal": "< 1e-3"}):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
