"""Layer losses on held-out inputs beside the calibration Gram, and ASVD in float32 beside float64.

Every layer loss a study reports is read on the calibration Gram, the one SVD-LLM minimises exactly: a method that
fits the calibration windows and fails on others would not show there. This check factors each named map by every
closed-form method from the calibration statistics (as the compress stage does) and reads each factorisation's layer
loss twice, per token: on the calibration Gram and on the Gram of windows calibration never read (the validation
split's first windows, as many tokens as calibration). ASVD is also factored in float64 from the same statistics, the
reference for its float32 factors.

    python -m scalelab.compress.heldout --params results/compression-smollm2/params.yaml --seed 0 --keep 0.75 \
        --maps 0.mlp.down_proj 3.self_attn.q_proj ... --out results/compression-smollm2/diagnostics/heldout/<f>.json
        [--model <HF folder>] [--prepared <prepared corpus folder>]

`--model` and `--prepared` default to the params' source and data/prepared (the import_model and prepare stages'
outs); naming them runs the check on a copy made elsewhere (`scalelab.model.gguf.import_gguf`,
`scalelab.data.corpus.prepare_corpus`), the same model and corpus.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from scalelab.compress import methods
from scalelab.compress.calibrate import Batch, Stats, calibration_batches, collect, fisher_rows
from scalelab.compress.rank import rank_for

METHODS = ("svd", "asvd", "asvd64", "fwsvd", "svd_llm")


def asvd64(weight: torch.Tensor, k: int, abs_mean: torch.Tensor, alpha: float = 0.5) -> methods.Factors:
    """ASVD's definition (methods.asvd) evaluated in float64 throughout: the reference for its float32 factors."""
    scale = abs_mean.double().clamp_min(methods.EPS) ** alpha
    u, s, vh = torch.linalg.svd(weight.double() * scale, full_matrices=False)
    root = s[:k].sqrt()
    return methods.Factors(u[:, :k] * root, root[:, None] * vh[:k] / scale, s)


def check_map(weight: torch.Tensor, k: int, calib: Stats, held: Stats, fisher: torch.Tensor,
              alpha: float = 0.5) -> dict:
    """One map: each method's layer loss per token on the calibration and the held-out Gram, each over SVD-LLM's on
    the same Gram, held-out over calibration, and ASVD's float32 factors against float64's."""
    grams = {"calib": calib.gram / calib.tokens, "held": held.gram / held.tokens}
    factors = {"svd": methods.plain_svd(weight, k), "asvd": methods.asvd(weight, k, calib.abs_mean, alpha),
               "asvd64": asvd64(weight, k, calib.abs_mean, alpha), "fwsvd": methods.fwsvd(weight, k, fisher),
               "svd_llm": methods.svd_llm(weight, k, calib.gram, root=calib.whitening())}
    loss = {name: {g: methods.layer_loss(weight, f.left, f.right, gram) for g, gram in grams.items()}
            for name, f in factors.items()}
    out = {}
    for name, by in loss.items():
        out[name] = by | {"calib_rel_svd_llm": by["calib"] / loss["svd_llm"]["calib"],
                          "held_rel_svd_llm": by["held"] / loss["svd_llm"]["held"],
                          "held_over_calib": by["held"] / by["calib"]}
    a32, a64 = factors["asvd"], factors["asvd64"]
    diff = a32.left.double() @ a32.right.double() - a64.left @ a64.right
    out["asvd_float32_vs_float64"] = {
        "weight_rel_diff": float(diff.norm() / (a64.left @ a64.right).norm()),
        **{f"{g}_loss_rel_diff": abs(loss["asvd"][g] - loss["asvd64"][g]) / loss["asvd64"][g] for g in grams}}
    out["abs_mean_max_over_min"] = float(calib.abs_mean.max() / calib.abs_mean.clamp_min(methods.EPS).min())
    return out


def held_out_batches(val, samples: int, seq_len: int, batch_size: int) -> list[Batch]:
    """The validation split's first `samples` windows of `seq_len` tokens: windows calibration never reads."""
    v = torch.as_tensor(val[: samples * seq_len + 1].astype("int64"))
    if v.numel() < samples * seq_len + 1:
        raise ValueError(f"the validation split has {v.numel()} tokens, fewer than {samples} × {seq_len} + 1")
    x, y = v[:-1].view(samples, seq_len), v[1:].view(samples, seq_len)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, samples, batch_size)]


def geo_mean(values) -> float:
    values = list(values)
    return float(torch.tensor(values, dtype=torch.float64).log().mean().exp())


def run(cfg, seed: int, keep: float, maps: list[str], model_dir: str | None = None,
        prepared: str | None = None) -> dict:
    """The check on `cfg` (a CompressConfig) at calibration seed `seed`, uniform kept fraction `keep`."""
    from scalelab.compress.cells import PREPARED, device
    from scalelab.data.streams import from_text
    from scalelab.compress.diagnose import resolve
    from scalelab.model.hf import load_causal_lm, load_hf_tokenizer
    from scalelab.runtime import placement

    placement.set_torch_threads(cfg.threads)
    location = model_dir or cfg.source.location()
    tokenizer = load_hf_tokenizer(location)
    model = load_causal_lm(location, cfg.source.dtype, device(cfg))
    data = from_text(Path(prepared) if prepared else PREPARED, tokenizer, cfg.calibration.max_text_tokens)
    cal = cfg.calibration
    batches = calibration_batches(data.train, samples=cal.samples, seq_len=cal.seq_len, batch_size=cal.batch_size,
                                  seed=seed)
    held_batches = held_out_batches(data.val, cal.samples, cal.seq_len, cal.batch_size)
    names = resolve(model, maps)
    t0 = time.perf_counter()
    calib, held = collect(model, batches, names), collect(model, held_batches, names)
    fisher = fisher_rows(model, batches, names)
    seconds_statistics = time.perf_counter() - t0
    alpha = next((m.alpha for m in cfg.methods.values() if m.kind == "asvd"), 0.5)
    records = []
    for short, name in zip(maps, names):
        weight = model.get_submodule(name).weight.detach()
        m, n = weight.shape
        k = rank_for(m, n, keep)
        records.append({"map": short, "m": m, "n": n, "rank": k} | check_map(weight, k, calib[name], held[name],
                                                                              fisher[name], alpha))
    summary = {name: {key: geo_mean(r[name][key] for r in records)
                      for key in ("calib_rel_svd_llm", "held_rel_svd_llm", "held_over_calib")} for name in METHODS}
    summary["asvd_float32_vs_float64_max"] = {key: max(r["asvd_float32_vs_float64"][key] for r in records)
                                              for key in records[0]["asvd_float32_vs_float64"]}
    return {"source": location, "seed": seed, "keep": keep, "alpha": alpha,
            "calib_tokens": cal.samples * cal.seq_len, "held_tokens": cal.samples * cal.seq_len,
            "held_out": "the validation split's first windows", "threads": torch.get_num_threads(),
            "seconds_statistics": seconds_statistics, "summary": summary, "maps": records}


def main(argv: list[str] | None = None) -> int:
    from scalelab.compress.diagnose import DEFAULT_MAPS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=float, default=0.75)
    ap.add_argument("--maps", nargs="*", default=DEFAULT_MAPS)
    ap.add_argument("--model", help="the model's HF folder (default: the params' compress.source)")
    ap.add_argument("--prepared", help="the prepared corpus folder (default: data/prepared)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from scalelab.compress.diagnose import compress_section
    from scalelab.data import write_json_atomic
    from scalelab.pipeline.stage import reported
    from scalelab.runtime.log import setup

    setup()

    def body() -> None:
        cfg = compress_section(args.params)
        write_json_atomic(Path(args.out), run(cfg, args.seed, args.keep, args.maps, args.model, args.prepared))

    return reported("compress held-out check", body)


if __name__ == "__main__":
    sys.exit(main())
