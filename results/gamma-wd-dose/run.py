"""The committed γ weight-decay dose-response (METHODS §A, issue 19): decay on input-norm γ (variant wd_in) and on
output-norm γ (wd_out: QK-norm in the base recipe) at `DOSES` × the matrices' rate (optim.adamw.scale_wd_mult), dose 0
being `standard` (no decay on γ), every arm on the same seeds, batches and init. Per run: final val loss, mean input-
and output-norm γ, sharpness (top Hessian eigenvalue at the last step); then the paired dose table and the wd_in /
wd_out claims decided at the lowest dose that moves γ (scalelab.analysis.claims_a.dose_claims).

    PYTHONPATH=src nice -n 15 python results/gamma-wd-dose/run.py results/gamma-wd-dose/params.yaml SIZE SEEDS...

One process, one thread, no DVC or MLflow; runs go to data/gamma-wd-dose/. Each finished run's row is appended to
runs.jsonl here at once, and a rerun skips the rows it finds there (the study can be stopped and resumed).
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from scalelab.config import load_params
from scalelab.analysis import claims, claims_a
from scalelab.train import Cell, fit

HERE = Path(__file__).resolve().parent
DOSES = (1.0, 10.0, 100.0)


class GammaMeans(Callback):
    """Mean raw γ of each scale kind at the end of training."""

    def on_train_end(self, trainer, pl_module) -> None:
        model, kinds = pl_module.model, {}
        for n, p in model.named_parameters():
            kinds.setdefault(model.param_kind(n), []).append(p.detach().float().flatten())
        self.means = {k: torch.cat(v).mean().item() for k, v in kinds.items() if k.endswith("scale")}


def main(params_path: str, size: str, seeds: list[int]) -> None:
    torch.set_num_threads(1)
    start, t0 = time.time(), time.perf_counter()
    params = load_params(params_path)
    done = HERE / "runs.jsonl"
    rows = [json.loads(line) for line in done.read_text().splitlines()] if done.is_file() else []
    before = len(rows)
    have = {(r["arm"], r["dose"], r["size"], r["seed"]) for r in rows}
    arms = [("standard", 0.0)] + [(arm, d) for arm in ("wd_in", "wd_out") for d in DOSES]
    for seed in seeds:
        for arm, dose in arms:
            if (arm, dose, size, seed) in have:
                continue
            adamw = params.optim["adamw"].model_copy(update={"scale_wd_mult": dose or 1.0})
            sub = params.model_copy(update={"optim": {**params.optim, "adamw": adamw}})
            probe = GammaMeans()
            m = fit(sub, Cell(arm, size, "base", seed), Path("data/gamma-wd-dose") / f"{arm}-{dose:g}-{size}-{seed}",
                    Path("data/tokens"), callbacks=[probe])
            rows.append({"arm": arm, "dose": dose, "size": size, "seed": seed, "val_loss": m["val_loss"],
                         "gamma_in": probe.means.get("input_scale"), "gamma_out": probe.means.get("output_scale"),
                         "sharpness": m.get("sharpness") if m.get("sharpness_converged", True) else None,
                         "lr_wd_T": adamw.lr * adamw.weight_decay * (dose or 0) * sub.pretrain.total_steps()})
            with done.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    level = params.scaling.level
    table, entries = claims_a.dose_table(rows, level), claims_a.gamma_wd_dose(HERE)  # the ledger from runs.jsonl
    trained = len(rows) - before
    rows = [r for r in rows if r["size"] == size and r["seed"] in seeds]
    (HERE / "dose_table.json").write_text(json.dumps(table, indent=1))
    claims.write_claims(HERE / "claims_a.json", entries)

    def pm(e, k, fmt):
        return "–" if e[k] is None else format(e[k], fmt) + ("" if e[f"{k}_spread"] is None
                                                              else " ± " + format(e[f"{k}_spread"], fmt[1:]))

    lines = ["| decayed γ | dose (× matrices' wd) | λ·η·T | shrinkage of mean γ | loss gain (no decay − dosed) | "
             "sharpness drop (log λ) | seeds |", "|---|---|---|---|---|---|---|"]
    lwt = {(r["arm"], r["dose"]): r["lr_wd_T"] for r in rows}
    for e in table:
        lines.append(f"| {e['kind']} | {e['dose']:g} | {lwt[e['arm'], e['dose']]:.3g} | {pm(e, 'shrinkage', '+.4f')} | "
                     f"{pm(e, 'loss_gain', '+.4f')} | {pm(e, 'sharpness_drop', '+.3f')} | {e['n_seeds']} |")
    (HERE / "dose_table.md").write_text("\n".join(lines) + "\n\n" + claims.markdown(entries) + "\n")
    if not trained and (HERE / "run.json").is_file():
        return  # nothing trained: the tables rewritten from runs.jsonl, the training run's record kept
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (HERE / "run.json").write_text(json.dumps({
        "command": f"PYTHONPATH=src nice -n 15 python results/gamma-wd-dose/run.py {params_path} {size} "
                   + " ".join(map(str, seeds)), "commit": commit,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start)), "wall_s": time.perf_counter() - t0,
        "threads": 1, "n_runs": len(rows),
        "note": "2 CPU cores shared with other sessions' jobs: wall times inflated by their load"}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]])
