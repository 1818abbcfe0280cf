"""The γ weight-decay dose-response (docs/scale-vectors.md "The dose-response"): decay on one kind of γ at several
multiples of the matrices' rate against none, from a study's pretrain cells (results/gamma-wd-dose, run by
`scalelab study gamma-wd-dose`), its paired dose table and the wd_in / wd_out claims decided at one dose.

A cell is a run: its arm is its variant (`standard`: no decay on γ, dose 0; `wd_in`: decay on input-norm γ; `wd_out`:
on output-norm γ), its dose the `scale_wd_mult` of its recipe's optimizer (λ_γ = dose · λ). A dose recipe is the base
recipe with that one number changed (`dose_of` refuses any other difference: the arms would differ in more than the
dose). Each run's γ are the cells' means of each kind (train/callbacks.py `kind_means`): `gamma_in` the input-norm γ
of the blocks, `gamma_out` the output-norm γ, `gamma_final` the final norm's apart.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from scalelab.ledger import claims, studies
from scalelab.scale_vectors import premises as premises_a
from scalelab.ledger.claims import claim
from scalelab.scale_vectors.claims import LABELS, LOSS_SESOI, PUB_WD
from scalelab.config import Params

# Per decayed kind: its arm (variant), and the runs' column of that kind's mean γ
DOSE_KINDS = {"wd_in": ("input", "gamma_in"), "wd_out": ("output", "gamma_out")}
ARMS = ("standard", *DOSE_KINDS)
# the cells' metrics (stages/pretrain.py) -> the runs' columns
COLUMNS = {"gamma_in": "gamma_input_mean", "gamma_out": "gamma_output_mean", "gamma_final": "gamma_final_mean"}


def varied_optimizer(params: Params, recipe: str, field: str, what: str):
    """The optimizer entry of `recipe`, which must differ from the base recipe in `optim.<its optimizer>.<field>`
    alone (a dose varies γ's decay, a rung of the LR ladder the LR); ValueError naming `what` its cells are not."""
    recipes, base = params.pretrain.recipes, params.pretrain.recipes["base"]
    mine = recipes[recipe]
    opt, base_opt = params.optim[mine.optimizer], params.optim[base.optimizer]
    if (mine.model_copy(update={"optimizer": base.optimizer}) != base
            or opt.model_copy(update={field: getattr(base_opt, field)}) != base_opt):
        raise ValueError(f"recipe {recipe!r} differs from the base recipe in more than optim.{mine.optimizer}"
                         f".{field}: its cells are no {what}")
    return opt


def dose_of(params: Params, recipe: str, variant: str) -> float:
    """The dose of a cell: its recipe's decay on γ over the matrices' (`scale_wd_mult`), 0 for `standard`. ValueError
    for a variant that is no arm, or a recipe that differs from the base recipe in more than that multiplier."""
    if variant not in ARMS:
        raise ValueError(f"cell of variant {variant!r}: the dose-response's arms are {', '.join(ARMS)}")
    opt = varied_optimizer(params, recipe, "scale_wd_mult", "dose of the same treatment")
    return 0.0 if variant == "standard" else opt.scale_wd_mult


def runs(folder: Path) -> tuple[Params, list[dict]]:
    """The study's params (its params.yaml) and one row per committed pretrain cell: arm, dose, size, seed, val_loss,
    the kinds' mean γ and the sharpness (None where its power iteration did not converge)."""
    folder = Path(folder)
    params = premises_a.study_params(folder)
    rows = []
    for name, path in studies.cell_files(folder, "metrics/pretrain", ".json").items():
        m = json.loads(path.read_text())
        if missing := [c for c in COLUMNS.values() if c not in m]:
            raise ValueError(f"{name}: no {', '.join(missing)} (written before the pretrain stage recorded each "
                             "kind's mean γ: rerun it with --refresh)")
        sharp = m.get("sharpness") if m.get("sharpness_converged", True) else None
        rows.append({"arm": m["variant"], "dose": dose_of(params, m["recipe"], m["variant"]), "size": m["size"],
                     "seed": m["seed"], "val_loss": m["val_loss"], "sharpness": sharp,
                     **{col: m[key] for col, key in COLUMNS.items()}})
    have = [(r["arm"], r["dose"], r["size"], r["seed"]) for r in rows]
    if dup := sorted({k for k in have if have.count(k) > 1}):
        raise ValueError(f"{folder.name}: more than one cell for (arm, dose, size, seed) {dup[0]}")
    return params, rows


def _paired(rows: list[dict], arm: str) -> dict[float, list[tuple[dict, dict]]]:
    """{dose: [(no decay on γ, dosed)]} of one arm, paired by seed."""
    zero = {r["seed"]: r for r in rows if r["arm"] == "standard"}
    out: dict[float, list] = {}
    for r in sorted(rows, key=lambda r: (r["dose"], r["seed"])):
        if r["arm"] == arm and r["seed"] in zero:
            out.setdefault(r["dose"], []).append((zero[r["seed"]], r))
    return out


def _log_drop(a: dict, b: dict) -> float | None:
    sa, sb = a["sharpness"], b["sharpness"]
    return math.log(sa) - math.log(sb) if sa and sb and sa > 0 and sb > 0 else None


def dose_table(rows: list[dict], level: float = 0.95) -> list[dict]:
    """Per decayed kind (`arm` wd_in / wd_out) and dose, paired by seed against dose 0 (`standard`): the shrinkage of
    that kind's mean γ (γ̄₀ − γ̄_d), of the final norm's (where the rows have it: decayed under wd_in only), the loss
    gain (loss₀ − loss_d, positive: the decay helps) and the sharpness drop (log λ₀ − log λ_d); each the mean over
    seeds with its t-interval half-width (`*_spread`, None for one seed)."""
    out = []
    for arm, (kind, col) in DOSE_KINDS.items():
        for dose, pairs in _paired(rows, arm).items():
            entry = {"arm": arm, "kind": kind, "dose": dose, "n_seeds": len(pairs)}
            for name, diff in (("shrinkage", lambda a, b: a[col] - b[col]),
                               ("final_shrinkage", lambda a, b: None if a.get("gamma_final") is None
                                or b.get("gamma_final") is None else a["gamma_final"] - b["gamma_final"]),
                               ("loss_gain", lambda a, b: a["val_loss"] - b["val_loss"]),
                               ("sharpness_drop", _log_drop)):
                vals = [v for a, b in pairs if (v := diff(a, b)) is not None]
                ci = claims.t_interval(vals, level)
                entry[name] = statistics.fmean(vals) if vals else None
                entry[f"{name}_spread"] = None if ci is None else ci[2] - ci[0]
            out.append(entry)
    return out


def dose_claims(rows: list[dict], params: Params, level: float = 0.95) -> list[dict]:
    """The wd_in / wd_out claims, each decided at one dose: the lowest whose premises all hold; where none does, the
    lowest that moved γ (its failed premises say why it is untested); where none moved γ, the dose whose per-step
    pull is nearest the paper's. Premises per dose: γ moved (the decayed kind's own mean; on input-norm γ the
    blocks', the final norm's apart), the per-step pull, and on input-norm γ the final norm (not decayed, or its mean
    recorded apart). wd_in helps: loss₀ − loss_d > 0; wd_out hurts: loss_d − loss₀ > 0, paired by seed."""
    sizes = sorted({r["size"] for r in rows})
    if len(sizes) != 1:
        raise ValueError(f"dose runs of sizes {sizes}: the dose claims compare one size")
    size, steps = sizes[0], params.pretrain.total_steps()
    cfg = params.resolve_model(size, "standard", vocab_size=params.tokenizer.vocab_size, recipe="base")
    reg = premises_a.budget_regime(params, *premises_a.dense_counts(cfg))
    entries = []
    for arm, key, sign in (("wd_in", "wd_in_helps", 1), ("wd_out", "wd_out_hurts", -1)):
        kind, col = DOSE_KINDS[arm]
        by_dose = _paired(rows, arm)
        if not by_dose:
            continue
        pull = {d: premises_a.scale_pull(params, "base", d) for d in by_dose}
        apart = all(r.get("gamma_final") is not None for pairs in by_dose.values() for p in pairs for r in p)
        what = f"the mean {kind}-norm γ" + (" of the blocks (the final norm's apart)" if kind == "input" and apart
                                            else "")
        checks = {}
        for d, pairs in by_dose.items():
            checks[d] = [premises_a.moved_premise([a[col] - b[col] for a, b in pairs], level, what),
                         premises_a.pull_premise(pull[d], steps)]
            if kind == "input":
                final = [a["gamma_final"] - b["gamma_final"] for a, b in pairs] if apart else None
                checks[d].append(premises_a.final_norm_premise(params.model.variants[arm], "the cells", final, level))
        ok = [d for d in by_dose if not claims.failed(checks[d])]
        moved = [d for d in by_dose if checks[d][0]["passed"]]
        nearest = min(by_dose, key=lambda d: abs(math.log(pull[d] / premises_a.PAPER_PULL)) if pull[d] > 0
                      else math.inf)
        dose = min(ok) if ok else min(moved) if moved else nearest
        why = ("the lowest dose whose premises hold" if ok else "the lowest dose that moves γ" if moved
               else "no dose moves γ: the dose nearest the paper's per-step pull")
        text = LABELS[key].replace("standard", "no decay on γ")
        entries.append(claim(f"dose.{key}", f"{text}, at {dose:g}x the matrices' decay ({why})",
                             f"final val loss, paired by seed, decay on γ at {dose:g}x vs none, size {size}",
                             [sign * (a["val_loss"] - b["val_loss"]) for a, b in by_dose[dose]], PUB_WD, level,
                             regime=reg, premises=checks[dose], smallest_effect=LOSS_SESOI))
    return entries


def gamma_wd_dose(folder: Path) -> list[dict]:
    """The ledger of a γ weight-decay dose-response study (results/gamma-wd-dose; its study.json `generator`): the
    dose claims from its committed cells under its own params.yaml, by today's code."""
    params, rows = runs(folder)
    return dose_claims(rows, params, params.scaling.level)


def _pm(e: dict, key: str, fmt: str) -> str:
    if e[key] is None:
        return "–"
    spread = e[f"{key}_spread"]
    return format(e[key], fmt) + ("" if spread is None else " ± " + format(spread, fmt.lstrip("+")))


def table_markdown(cells_dir: Path) -> str:
    """The dose table of a study from its committed cells (`cells_dir`: its cells/ folder, as the README's generated
    block names it): per decayed kind and dose, λ·η·T, and each paired difference ± its t half-width."""
    params, rows = runs(Path(cells_dir).parent)
    steps = params.pretrain.total_steps()
    lines = ["| decayed γ | dose (× matrices' wd) | λ·η·T | shrinkage of its mean γ | shrinkage of the final γ | "
             "loss gain (no decay − dosed) | sharpness drop (log λ) | seeds |", "|---|---|---|---|---|---|---|---|"]
    for e in dose_table(rows, params.scaling.level):
        pull_t = premises_a.scale_pull(params, "base", e["dose"]) * steps
        lines.append(f"| {e['kind']} | {e['dose']:g} | {pull_t:.3g} | {_pm(e, 'shrinkage', '+.4f')} | "
                     f"{_pm(e, 'final_shrinkage', '+.4f')} | {_pm(e, 'loss_gain', '+.4f')} | "
                     f"{_pm(e, 'sharpness_drop', '+.3f')} | {e['n_seeds']} |")
    return "\n".join(lines)


def previous_markdown(previous: Path, cells_dir: Path) -> str:
    """The study's cells beside the runs an earlier run recorded (`previous`: one JSON row per run with arm, dose,
    seed, val_loss, gamma_in, gamma_out, sharpness; its gamma_in the mean of every input-norm γ, the final norm's
    included): per run, each value then and now, the cells' input γ pooled the same way (each vector once)."""
    params, rows = runs(Path(cells_dir).parent)
    now = {(r["arm"], r["dose"], r["seed"]): r for r in rows}
    every = [json.loads(line) for line in Path(previous).read_text().splitlines() if line.strip()]
    then = [r for r in every if (r["arm"], r["dose"], r["seed"]) in now]  # a study in progress: the cells it has
    cfg = params.resolve_model(rows[0]["size"], "standard", vocab_size=2, recipe="base")
    blocks = premises_a.gamma_vectors(cfg)["input_scale"] - 1  # the final γ is one of the input-norm vectors

    def pooled(r: dict) -> float:
        return (blocks * r["gamma_in"] + r["gamma_final"]) / (blocks + 1)

    def pair(a, b, fmt: str) -> str:
        return "–" if a is None or b is None else f"{format(a, fmt)} → {format(b, fmt)}"

    lines = ["| arm | dose | seed | val loss | Δ val loss | mean input-norm γ (final included) | mean output-norm γ | "
             "λ_max |", "|---|---|---|---|---|---|---|---|"]
    gaps: dict[str, list[float]] = {"val loss": [], "input γ": [], "output γ": [], "λ_max (relative)": []}
    for r in sorted(then, key=lambda r: (r["arm"] != "standard", r["arm"], r["dose"], r["seed"])):
        n = now[r["arm"], r["dose"], r["seed"]]
        lines.append(f"| {r['arm']} | {r['dose']:g} | {r['seed']} | {pair(r['val_loss'], n['val_loss'], '.4f')} | "
                     f"{n['val_loss'] - r['val_loss']:+.4f} | {pair(r['gamma_in'], pooled(n), '.4f')} | "
                     f"{pair(r['gamma_out'], n['gamma_out'], '.4f')} | {pair(r['sharpness'], n['sharpness'], '.1f')} |")
        gaps["val loss"].append(abs(n["val_loss"] - r["val_loss"]))
        gaps["input γ"].append(abs(pooled(n) - r["gamma_in"]))
        gaps["output γ"].append(abs(n["gamma_out"] - r["gamma_out"]))
        if r["sharpness"] and n["sharpness"]:
            gaps["λ_max (relative)"].append(abs(n["sharpness"] / r["sharpness"] - 1))
    largest = ", ".join(f"{k} {max(v):.2g}" for k, v in gaps.items() if v)
    left = f" ({len(every) - len(then)} of the {len(every)} runs have no cell yet)" if len(then) < len(every) else ""
    return "\n".join(lines) + f"\n\nLargest difference over the {len(then)} runs{left}: {largest or 'none'}."
