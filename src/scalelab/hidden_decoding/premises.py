"""The measured premises of the Hidden Decoding claims (scalelab.ledger.claims rule 1), each computed from a run's
own numbers, and the regime each claim ran in.

Two kinds of run, two sets of premises:
- a **parity probe** (scalelab.hidden_decoding.parity): at the K its claims compare, n = 1 must stay near the blind ln 2
  (`room`) and one stream with K pause tokens before the answer must solve it (`positive control`,
  `parity_premises`);
- a **continued pretraining**: under the open start n > 1 does not start where n = 1 does (its mixing layers read the
  hidden streams from the first step), so a comparison is only read once n > 1 has recovered
  that step-0 gap (`recovered`, from the gap's curve over training or over budgets); under the gated start it does,
  and the comparison tests the method only once its gates have opened (`gate_opened`).
Claim-specific: a growth or SFA claim is testable only where the gain it is measured against is there (`shown`), and
separate tables only act once they have moved apart (`tables_diverged`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from scalelab.ledger import claims as ledger

LEARNS = 0.1  # n = 1 on the parity probe closes less than this of the ln 2 -> 0 answer gap: it has room
SOLVED = 0.99  # answer accuracy at which a parity probe's cell solves its K
SHRINK = 0.1  # a gap that shrank by less than this fraction between the last two points has stopped recovering
# A gated start (scalelab.hidden_decoding.gate) is the backbone at α = 0 and the method's mixing at α = 1: its
# cell tests Hidden Decoding once the gates are at least half open, else it compares n = 1 with itself, nearly
GATE_OPEN = 0.5

# The paper's regime (continued pretraining of an 8B backbone, the tokens by n), beside every entry's own.
PAPER_PARAMS = 8e9
PAPER_TOKENS = {2: 75e9, 4: 150e9, 8: 187e9}
PAPER = "continued pretraining of an 8B backbone on 75B, 150B and 187B tokens for n = 2, 4 and 8"


def regime(n: int, *, params: int | None, non_embedding_params: int | None, tokens: int | None,
           steps: int | None, probe: bool) -> dict:
    """The regime of a claim about n streams: this run's size and budget beside the paper's tokens per parameter at
    that n (none for a probe: a mechanism test has no counterpart in the paper's runs). Stated as a sign at this
    scale."""
    tpp = None if probe or n not in PAPER_TOKENS else PAPER_TOKENS[n] / PAPER_PARAMS
    return ledger.regime(PAPER, params=params, non_embedding_params=non_embedding_params, tokens=tokens, steps=steps,
                         paper_tokens_per_param=tpp, scope="small-scale")


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
    """`cell` (n > 1) has recovered its step-0 gap: at the last point it is no worse than n = 1 (mean gap ≤ 0), or
    its gap shrank by less than SHRINK between the last two points (the start's perturbation has played out)."""
    name = f"{cell} recovered its step-0 gap"
    need = (f"{cell} no worse than n = 1 at the last point, or its gap shrinking by < {SHRINK:.0%} between the last "
            "two (the non-function-preserving start played out)")
    if not points:
        return ledger.premise(name, "no curve", False, need)
    (t1, g1) = points[-1]
    last = statistics.fmean(g1)
    value = f"gap {last:+.4f} at {t1:.0f} tokens"
    if last <= 0:
        return ledger.premise(name, value + ": level or ahead", True, need)
    if len(points) < 2:
        return ledger.premise(name, value + ", one point: no trend", False, need)
    t0, g0 = points[-2]
    before = statistics.fmean(g0)
    shrink = (before - last) / before if before > 0 else 0.0
    value = f"gap {before:+.4f} at {t0:.0f} → {last:+.4f} at {t1:.0f} tokens ({shrink:.0%} shrink)"
    return ledger.premise(name, value, shrink < SHRINK, need)


def gate_opened(cell: str, rows: Sequence[Mapping]) -> dict:
    """The treatment acted in a gated cell: its gates' mean α (`gate_mean` in the cell's metrics) at least GATE_OPEN
    in every seed."""
    name, need = f"{cell}'s gates opened", (f"the mean gate α of {cell}'s mixing layers at least {GATE_OPEN:g} in every "
                                            "seed (0: the backbone's function, 1: the method's mixing)")
    values = [m.get("gate_mean") for m in rows]
    if not values or any(v is None for v in values):
        return ledger.premise(name, "not logged", False, need)
    return ledger.premise(name, f"α {min(values):.3g} (lowest seed)", min(values) >= GATE_OPEN, need)


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
