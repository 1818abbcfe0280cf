"""The SigmaScale diagnostics (diagnostics.py) as one cell: a model, its calibration at one seed, a set of maps.

    python -m scalelab.compress.diagnose --params results/<study>/params.yaml --seed 0 --keep 0.75 \
        --maps 3.self_attn.q_proj 3.mlp.down_proj ... [--optimiser 3.self_attn.q_proj ...] --out <file>.json
        [--init asvd] [--max-steps 300] [--patience 10]

Reads compress.source, compress.calibration and compress.sigmascale of the params file (the study's settings), draws
the seed's calibration windows from the train split as the compress stage does, collects the statistics of the named
maps only (a forward pass stops once they have all seen their inputs), and writes one JSON object: the settings, one
record per map (`stopping`, and `optimiser` for the maps named there) and their geometric means. A map is named by
its suffix after `model.layers.`: `<block>.<module path>`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from scalelab.compress import diagnostics
from scalelab.compress.calibrate import calibration_batches, collect, decoder_linears
from scalelab.compress.rank import rank_for

log = logging.getLogger("scalelab.compress.diagnose")  # also when run as __main__
# Ten maps of SmolLM2-135M (30 blocks): every kind of map, at three depths
DEFAULT_MAPS = ["3.self_attn.q_proj", "3.self_attn.k_proj", "3.self_attn.v_proj", "3.self_attn.o_proj",
                "3.mlp.gate_proj", "3.mlp.up_proj", "3.mlp.down_proj", "15.self_attn.o_proj", "15.mlp.down_proj",
                "27.self_attn.k_proj"]


def resolve(model, short: list[str]) -> list[str]:
    """Full map names for `<block>.<module path>` suffixes; an unknown one is a one-line error naming it."""
    from scalelab.data import DataError

    names = [n for block in decoder_linears(model) for n in block]
    out = []
    for s in short:
        match = [n for n in names if n.endswith(f"layers.{s}")]
        if len(match) != 1:
            raise DataError(f"--maps: {s!r} names {len(match)} decoder maps (expected one, e.g. '3.mlp.down_proj')")
        out.append(match[0])
    return out


def run(cfg, seed: int, keep: float, maps: list[str], optimiser_maps: list[str], lrs: tuple[float, ...] = (2e-2,),
        max_evals: int = 400, init: str = "random") -> dict:
    """The diagnostics cell on `cfg` (a CompressConfig) at calibration seed `seed` and uniform kept fraction `keep`;
    the stopping diagnostic from the start `init`."""
    from scalelab.compress.cells import device, streams
    from scalelab.model.hf import load_causal_lm, load_hf_tokenizer
    from scalelab.runtime import placement

    placement.set_torch_threads(cfg.threads)
    location = cfg.source.location()
    tokenizer = load_hf_tokenizer(location)
    model = load_causal_lm(location, cfg.source.dtype, device(cfg))
    data = streams(cfg, tokenizer)
    cal = cfg.calibration
    batches = calibration_batches(data.train, samples=cal.samples, seq_len=cal.seq_len, batch_size=cal.batch_size,
                                  seed=seed)
    extra = resolve(model, optimiser_maps)
    names = list(dict.fromkeys(resolve(model, maps) + extra))
    t0 = time.perf_counter()
    stats = collect(model, batches, names)
    seconds_calibration = time.perf_counter() - t0
    records = []
    for name in names:
        weight = model.get_submodule(name).weight.detach()
        m, n = weight.shape
        k = rank_for(m, n, keep)
        rec = {"name": name, "m": m, "n": n, "rank": k,
               "stopping": diagnostics.stopping(name, weight, k, stats[name], seed, cfg.sigmascale, init)}
        log.info("%s: fixed/plateau loss %.4f (%.0f s)", name, rec["stopping"]["fixed_over_plateau"],
                 rec["stopping"]["seconds"])
        if name in extra:
            rec["optimiser"] = diagnostics.optimiser(name, weight, k, stats[name], seed, cfg.sigmascale,
                                                     lrs=lrs, max_evals=max_evals, paper=rec["stopping"])
            log.info("%s: paper %.3f, floor %.3f of SVD-LLM (best: %s)", name, rec["optimiser"]["paper_rel_svd_llm"],
                     rec["optimiser"]["floor_rel_svd_llm"], rec["optimiser"]["best_run"])
        records.append(rec)
    gm = diagnostics.geo_mean
    stop = [r["stopping"] for r in records]
    opt = [r["optimiser"] for r in records if "optimiser" in r]
    summary = {"maps": len(stop), "fixed_over_plateau": gm(s["fixed_over_plateau"] for s in stop),
               "fixed_rel_svd_llm": gm(s["loss_fixed"] / s["loss_svd_llm"] for s in stop),
               "plateau_rel_svd_llm": gm(s["loss_plateau"] / s["loss_svd_llm"] for s in stop),
               "plateau_fired": sum(s["plateau_step"] is not None for s in stop),
               "seconds_stopping": sum(s["seconds"] for s in stop), "seconds_calibration": seconds_calibration}
    if opt:
        summary |= {"optimiser_maps": len(opt), "paper_rel_svd_llm": gm(o["paper_rel_svd_llm"] for o in opt),
                    "floor_rel_svd_llm": gm(o["floor_rel_svd_llm"] for o in opt),
                    "optimiser_share_median": sorted(o["optimiser_share"] for o in opt)[len(opt) // 2],
                    "seconds_optimiser": sum(r["seconds"] for o in opt for r in o["runs"].values())}
    return {"source": location, "seed": seed, "keep": keep, "calib_tokens": cal.samples * cal.seq_len, "init": init,
            "sigmascale": cfg.sigmascale.model_dump(mode="json"), "threads": torch.get_num_threads(),
            "summary": summary, "maps": records}



def compress_section(params_path: str):
    """The compress section of a params file, for the diagnostics' command lines; a ParamsError without one."""
    from scalelab.config import ParamsError, load_params

    cfg = load_params(params_path).compress
    if cfg is None:
        raise ParamsError(f"{params_path} has no compress section")
    return cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", type=float, default=0.75)
    ap.add_argument("--maps", nargs="*", default=DEFAULT_MAPS)
    ap.add_argument("--optimiser", nargs="*", default=[], help="maps that also get the optimiser diagnostic")
    ap.add_argument("--lrs", type=float, nargs="*", default=[2e-2], help="AdamW learning rates beside the paper's")
    ap.add_argument("--max-evals", type=int, default=400, help="L-BFGS objective evaluations per map and start")
    ap.add_argument("--init", choices=("random", "svd_llm", "asvd"), default="random",
                    help="the stopping diagnostic's start (default: the paper's)")
    ap.add_argument("--max-steps", type=int, help="compress.sigmascale.max_steps for this run (default: the params')")
    ap.add_argument("--patience", type=int, help="compress.sigmascale.patience for this run (default: the params')")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from scalelab.data import write_json_atomic
    from scalelab.pipeline.stage import reported
    from scalelab.runtime.log import setup

    setup()

    def body() -> None:
        cfg = compress_section(args.params)
        over = {k: v for k, v in (("max_steps", args.max_steps), ("patience", args.patience)) if v is not None}
        cfg = cfg.model_copy(update={"sigmascale": cfg.sigmascale.model_copy(update=over)})
        result = run(cfg, args.seed, args.keep, args.maps, args.optimiser, tuple(args.lrs), args.max_evals, args.init)
        write_json_atomic(Path(args.out), result)

    return reported("compress diagnostics", body)


if __name__ == "__main__":
    sys.exit(main())
