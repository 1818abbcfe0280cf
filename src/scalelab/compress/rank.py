"""Ranks from a kept fraction: uniform, ASVD's sensitivity-based allocation, or the same threshold on SVD-LLM's
whitened truncation loss.

A rank-k factorisation of an m×n map stores k(m+n) weights, so keeping a fraction ρ of its m·n weights gives

    k = ⌊ρ·m·n/(m+n)⌋.

At ρ = 1 a factorisation saves nothing and loses accuracy, so a layer allocated ρ = 1 stays dense (rank None).

Sensitivity (ASVD, arXiv 2312.05821 §3.3): for every layer l and candidate fraction r, `sens[l][r]` is the
calibration loss of the model with only layer l truncated to r. ASVD then picks one threshold τ for all layers: each
layer takes the smallest r whose loss stays ≤ τ, and τ is the smallest (by binary search over the measured losses)
that keeps at most the target fraction of the compressed layers' weights.

Whitened (beyond the papers): the same threshold rule on a table the calibration already holds, with no forward
pass. With σ_i the singular values of W·S (S Sᵀ = C, SVD-LLM's whitening), SVD-LLM's layer loss at rank k is
Σ_{i>k} σ_i² and the map's output energy ‖WX‖²_F is Σ_i σ_i², so

    white[l][r] = Σ_{i>k_r} σ_i² / Σ_i σ_i²,   k_r = ⌊r·m·n/(m+n)⌋,   white[l][1] = 0

is the share of map l's output energy the optimal rank-k_r truncation discards: one unit for every map, whatever the
scale of its outputs, so one threshold compares them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def rank_for(m: int, n: int, keep: float) -> int | None:
    """k = ⌊ρ·m·n/(m+n)⌋ for kept fraction ρ = `keep`; None (stay dense) at ρ = 1."""
    if not 0 < keep <= 1:
        raise ValueError(f"kept fraction {keep} must be in (0, 1]")
    if keep == 1:
        return None
    return max(1, int(keep * m * n // (m + n)))


def weights(m: int, n: int, rank: int | None) -> int:
    """Weights a layer stores: k(m+n) factored, m·n dense."""
    return m * n if rank is None else rank * (m + n)


def uniform(shapes: Mapping[str, tuple[int, int]], keep: float) -> dict[str, int | None]:
    """The same kept fraction for every layer; `shapes[name] = (m, n)` (out, in)."""
    return {name: rank_for(m, n, keep) for name, (m, n) in shapes.items()}


def sensitivity(shapes: Mapping[str, tuple[int, int]], sens: Mapping[str, Mapping[float, float]],
                keep: float) -> dict[str, int | None]:
    """ASVD's threshold allocation: the weight budget is `keep` of the layers' dense weights; `sens[name][r]` is the
    calibration loss with only `name` kept at fraction r (r = 1.0: dense, the model's own loss)."""
    budget = keep * sum(m * n for m, n in shapes.values())

    def pick(tau: float) -> dict[str, float]:
        # the smallest fraction within τ; dense (1.0) is always allowed
        return {name: min([r for r, loss in sens[name].items() if loss <= tau] + [1.0]) for name in shapes}

    def cost(choice: Mapping[str, float]) -> int:
        return sum(weights(m, n, rank_for(m, n, choice[name])) for name, (m, n) in shapes.items())

    taus: Sequence[float] = sorted({loss for table in sens.values() for loss in table.values()})
    lo, hi = 0, len(taus) - 1  # cost falls as τ rises: find the smallest τ within budget
    if not taus or cost(pick(taus[hi])) > budget:
        return uniform(shapes, keep)  # no threshold meets the budget with the candidates: fall back to uniform
    while lo < hi:
        mid = (lo + hi) // 2
        if cost(pick(taus[mid])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    choice = pick(taus[lo])
    return {name: rank_for(m, n, choice[name]) for name, (m, n) in shapes.items()}


def whitened_table(spectra: Mapping[str, Sequence[float]], shapes: Mapping[str, tuple[int, int]],
                   ratios: Sequence[float]) -> dict[str, dict[float, float]]:
    """`white[name][r]` (module docstring) from each map's whitened singular values `spectra[name]` (σ(W·S)); a
    map with no output energy loses nothing at any candidate."""
    out = {}
    for name, (m, n) in shapes.items():
        energy = [float(s) ** 2 for s in spectra[name]]
        total = sum(energy)
        row = {}
        for r in ratios:
            k = rank_for(m, n, r)
            row[float(r)] = 0.0 if k is None or total == 0 else sum(energy[k:]) / total
        out[name] = row
    return out
