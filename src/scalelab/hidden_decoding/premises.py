"""The measured premises of the Hidden Decoding claims (scalelab.ledger.claims rule 1), each computed from a run's
own numbers, and the regime each claim ran in.

Two kinds of run, two sets of premises:
- a **parity probe** (scalelab.hidden_decoding.parity): at the K its claims compare, n = 1 must stay near the blind ln 2
  (`room`) and one stream with K pause tokens before the answer must solve it (`positive control`,
  `parity_premises`);
- a **continued pretraining**: premises about its setup, each with a bound its profile fixes before any cell runs
  (hidden_decoding.claims; a study that sets none has none of them): the backbone was trained (`backbone_trained`,
  its own pretraining's plateau rule), the start preserves its function (`start_preserved`, the step-0 gap to
  n = 1 in every seed), the budget is within a stated factor of the paper's tokens per parameter (`budget`); and in
  every continued pretraining, that n > 1 has recovered whatever step-0 gap it had (`recovered`, with an absolute
  floor) and that its cross-stream mixing acts (`mixing_acts`: the end-of-run loss with the mixing switched off
  differs from the trained model's, a function-level check that holds for an open and a gated start alike).
Claim-specific: an SFA claim (a fraction of full attention's gain) is testable only where that gain is there
(`shown`), and separate tables only act once they have moved apart (`tables_diverged`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from scalelab.ledger import claims as ledger

LEARNS = 0.1  # n = 1 on the parity probe closes less than this of the ln 2 -> 0 answer gap: it has room
SOLVED = 0.99  # answer accuracy at which a parity probe's cell solves its K
SHRINK = 0.1  # a gap that shrank by less than this fraction between the last two points has stopped recovering
# A gap to n = 1 below a tenth of the claims' smallest effect of interest (0.01 nats, hidden_decoding.ledger) is
# recovered whatever its trend: what is left of it cannot move a verdict by an effect of interest, and without a
# floor the sign of a gap of a ten-thousandth decided the premise.
RECOVERED_FLOOR = 0.001

# The paper's regime (continued pretraining of an 8B backbone, the tokens by n), beside every entry's own.
PAPER_PARAMS = 8e9
PAPER_TOKENS = {2: 75e9, 4: 150e9, 8: 187e9}
PAPER = "continued pretraining of an 8B backbone on 75B, 150B and 187B tokens for n = 2, 4 and 8"


def paper_tokens_per_param(n: int) -> float | None:
    """The paper's continued-pretraining tokens per backbone parameter at n streams (None where it ran no such n)."""
    return PAPER_TOKENS[n] / PAPER_PARAMS if n in PAPER_TOKENS else None


def regime(n: int, *, params: int | None, non_embedding_params: int | None, tokens: int | None,
           steps: int | None, probe: bool, per_non_embedding: bool = False, scope: str = "small-scale") -> dict:
    """The regime of a claim about n streams: this run's size and budget beside the paper's tokens per parameter at
    that n (none for a probe: a mechanism test has no counterpart in the paper's runs). `per_non_embedding`: this
    run's tokens per parameter are counted over the backbone's non-embedding parameters, the count its own
    pretraining budget was set in (a small model's vocabulary tables are most of its parameters and little of its
    compute); the paper's stay its tokens over its 8B parameters. `scope` "paper" where the study claims the paper's
    regime (its budget premise checks it), else a sign at this scale."""
    tpp = None if probe else paper_tokens_per_param(n)
    reg = ledger.regime(PAPER, params=params, non_embedding_params=non_embedding_params, tokens=tokens, steps=steps,
                        paper_tokens_per_param=tpp, scope=scope)
    if per_non_embedding and tokens and non_embedding_params:
        own = tokens / non_embedding_params
        reg |= {"tokens_per_param": own, "ratio": own / tpp if tpp else None,
                "paper": PAPER + " (this run: tokens per non-embedding parameter of its backbone)"}
    return reg


def budget(reg: dict, factor: float) -> dict:
    """The continued pretraining's tokens per parameter at least the paper's over `factor` (the regime's ratio)."""
    ratio, paper = reg.get("ratio"), reg.get("paper_tokens_per_param")
    value = (None if ratio is None else
             f"{reg['tokens_per_param']:.4g} tokens/param, {ratio:.3g}x the paper's {paper:.4g}")
    return ledger.premise("budget", value, ratio is not None and ratio >= 1 / factor,
                          f"tokens per parameter at least the paper's over {factor:g} (within {factor:g}x of it)")


def shown(name: str, diffs: Sequence[float], level: float, need: str) -> dict:
    """The premise that an effect is there: its per-seed differences' t interval lies above 0 (the ledger's interval;
    a premise asks whether the effect is there at all, so no smallest effect enters: the interval's sign is read)."""
    clean = [float(d) for d in diffs]
    interval = ledger.t_interval(clean, level)
    decision = (f"{ledger.INCONCLUSIVE} (no data)" if not clean
                else f"{ledger.INCONCLUSIVE} (1 seed)" if interval is None
                else f"{ledger.INCONCLUSIVE} ({ledger.NO_VARIANCE})" if ledger.no_seed_variance(clean)
                else ledger.CONTRADICTED if interval[2] < 0 else ledger.REPRODUCED if interval[1] > 0
                else ledger.INCONCLUSIVE)
    interval = ledger.t_interval(list(diffs), level)
    value = (f"{interval[0]:+.4f} ± {interval[2] - interval[0]:.4f} ({decision})" if interval
             else decision)
    return ledger.premise(name, value, decision == ledger.REPRODUCED, f"{need} (t interval above 0)")


def parity_premises(K: int, pause_acc: Sequence[float], n1_closed: Sequence[float], hints: bool = False) -> list[dict]:
    """A parity probe's premises at the K its claims compare: `room` (n = 1 stays near the blind ln 2: it closes
    less than LEARNS of the ln 2 → 0 answer gap in every seed) and `positive control` (one stream with K pause tokens
    before the answer, same backbone and steps, solves it: answer accuracy ≥ SOLVED in every seed; `hints`: its pauses
    trained on threshold hints)."""
    room = (f"n = 1 closes at most {max(n1_closed):.1%} of the answer gap at K = {K} ({len(n1_closed)} seeds)"
            if n1_closed else "no n = 1 cell")
    kind = "pause tokens with threshold hints" if hints else "pause tokens"
    control = (f"{kind}: answer accuracy {min(pause_acc):.3f} at K = {K}, the lowest of {len(pause_acc)} seeds"
               if pause_acc else "none run")
    return [ledger.premise("room", room, bool(n1_closed) and max(n1_closed) < LEARNS,
                           f"n = 1 closes < {LEARNS:.0%} of the ln 2 → 0 answer gap in every seed (stays near ln 2)"),
            ledger.premise("positive control", control, bool(pause_acc) and min(pause_acc) >= SOLVED,
                           f"one stream with K pause tokens before the answer{' trained on threshold hints' * hints} "
                           f"(same backbone and steps) reaches answer accuracy ≥ {SOLVED} in every seed")]


GapCurve = Sequence[tuple[float, Sequence[float]]]  # (tokens, per-seed loss(n) − loss(n = 1)), by tokens


def gap_curve(curves: Mapping[int, Sequence[tuple[float, float]]],
              base: Mapping[int, Sequence[tuple[float, float]]]) -> list[tuple[float, list[float]]]:
    """(tokens, per-seed loss(cell) − loss(n = 1)) at every token count both validated at, paired by seed; `curves`
    and `base`: seed → [(tokens, val_loss)]."""
    out: dict[float, list[float]] = {}
    for seed in sorted(curves):
        ref = dict(base.get(seed, ()))
        for tokens, loss in curves[seed]:
            if tokens in ref:
                out.setdefault(tokens, []).append(loss - ref[tokens])
    return sorted(out.items())


def recovered(cell: str, points: GapCurve) -> dict:
    """`cell` (n > 1) has recovered its step-0 gap: at the last point its mean gap to n = 1 is at most
    RECOVERED_FLOOR (level, ahead, or behind by less than the floor), or its gap shrank by less than SHRINK between
    the last two points (the start's perturbation has played out)."""
    name = f"{cell} recovered its step-0 gap"
    need = (f"{cell} behind n = 1 by at most {RECOVERED_FLOOR:g} at the last point, or its gap shrinking by "
            f"< {SHRINK:.0%} between the last two (the start's perturbation played out)")
    if not points:
        return ledger.premise(name, "no curve", False, need)
    (t1, g1) = points[-1]
    last = statistics.fmean(g1)
    value = f"gap {last:+.4f} at {t1:.0f} tokens"
    if last <= RECOVERED_FLOOR:
        return ledger.premise(name, value + (": level or ahead" if last <= 0 else ": within the floor"), True, need)
    if len(points) < 2:
        return ledger.premise(name, value + ", one point: no trend", False, need)
    t0, g0 = points[-2]
    before = statistics.fmean(g0)
    shrink = (before - last) / before if before > 0 else 0.0
    value = f"gap {before:+.4f} at {t0:.0f} → {last:+.4f} at {t1:.0f} tokens ({shrink:.0%} shrink)"
    return ledger.premise(name, value, shrink < SHRINK, need)


def mixing_acts(cell: str, rows: Sequence[Mapping], level: float = 0.95) -> dict:
    """The treatment acts in `cell`: its end-of-run validation loss with the cross-stream mixing switched off
    (`val_loss_mixing_off`, HiddenDecodingLM.mixing_off) differs from the trained model's (`val_loss_mixing_on`, the
    same windows), the per-seed difference's t interval excluding 0 on either side. A function-level check: it
    holds whatever the mixing's sign (helping or hurting), and fails where the prediction ignores the hidden
    streams (a gate that stayed shut, attention that learned to skip them)."""
    name = f"{cell}'s mixing acts"
    need = (f"the validation loss of {cell} with its cross-stream mixing switched off differs from the trained "
            f"model's: the {level:.0%} t interval of (off − on) over seeds excludes 0")
    diffs = [None if m.get("val_loss_mixing_off") is None or m.get("val_loss_mixing_on") is None
             else m["val_loss_mixing_off"] - m["val_loss_mixing_on"] for m in rows]
    if not diffs or any(d is None for d in diffs):
        return ledger.premise(name, "not measured", False, need)
    interval = ledger.t_interval(diffs, level)
    if interval is None:
        return ledger.premise(name, f"off − on {diffs[0]:+.4f}, 1 seed: no interval", False, need)
    mean, low, high = interval
    return ledger.premise(name, f"off − on {mean:+.4f} ± {high - mean:.4f}", low > 0 or high < 0, need)


def start_preserved(cell: str, gaps: Sequence[float], bound: float) -> dict:
    """The start preserves the backbone's function: `cell`'s step-0 validation loss minus n = 1's (the backbone's),
    per seed on the same windows, within ±`bound` in every seed."""
    name = f"{cell} starts at the backbone's function"
    need = f"|loss({cell}) − loss(n = 1)| at step 0 at most {bound:g} in every seed"
    if not gaps:
        return ledger.premise(name, "not measured", False, need)
    worst = max(gaps, key=abs)
    return ledger.premise(name, f"step-0 gap {worst:+.4f} (the largest of {len(gaps)} seeds)",
                          abs(worst) <= bound, need)


def plateau_share(curve: Sequence[Sequence[float]]) -> float | None:
    """The share of a pretraining's validation-loss drop, from its first validation to its last, that came in the
    last quarter of its tokens (from the last validation at or before three quarters of them); None without three
    points."""
    points = sorted((float(t), float(v)) for t, v in curve)
    if len(points) < 3:
        return None
    end_tokens, end = points[-1]
    quarter = [v for t, v in points if t <= 0.75 * end_tokens]
    drop = points[0][1] - end
    if not quarter or drop <= 0:
        return None
    return (quarter[-1] - end) / drop


def backbone_trained(rows: Sequence[Mapping], plateau: float) -> dict:
    """Every seed's backbone was trained, not caught mid-descent: the last quarter of its own pretraining's tokens
    gave less than `plateau` of its validation-loss drop (`plateau_share` of `backbone_run` in the cells' metrics)."""
    need = (f"the last quarter of each seed's backbone pretraining gave < {plateau:.0%} of its validation-loss drop "
            "since its first validation (its plateau rule)")
    runs = [m.get("backbone_run") for m in rows]
    if not runs or any(r is None for r in runs):
        return ledger.premise("backbone trained", "not recorded", False, need)
    shares = [plateau_share(r.get("val_curve") or []) for r in runs]
    if any(x is None for x in shares):
        return ledger.premise("backbone trained", "curve too short", False, need)
    return ledger.premise("backbone trained", f"{max(shares):.1%} of the drop in the last quarter (the largest of "
                          f"{len(shares)} seeds)", max(shares) < plateau, need)


def tables_diverged(rows: Sequence[Mapping]) -> dict:
    """Separate tables acted: in every seed they end further apart than they started (`table_spread` over
    `table_spread_start`, the mean relative distance of E_2..E_n from E_1, in the cell's metrics)."""
    need = "the separate tables end further apart than their initial noise, in every seed"
    pairs = [(m.get("table_spread_start"), m.get("table_spread")) for m in rows]
    if not pairs or any(a is None or b is None for a, b in pairs):
        return ledger.premise("tables diverged", "not logged", False, need)
    ratio = min(b / a for a, b in pairs) if all(a > 0 for a, _ in pairs) else None
    return ledger.premise("tables diverged", None if ratio is None else f"×{ratio:.3g} their start (min over seeds)",
                          ratio is not None and ratio > 1, need)
