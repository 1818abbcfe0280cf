"""Spectrum concentration of a matrix: effective rank and participation ratio of its singular values.

    erank(M) = exp(H(p)),  p = σ / Σσ,  H(p) = −Σ p log p        (Roy & Vetterli 2007)
    PR(M)    = (Σσ)² / Σσ²

Both lie in [1, rank(M)] and equal r for r equal singular values; SigmaScale's claim is that scalings which lower
them (energy in fewer directions) lose less to truncation.
"""

from __future__ import annotations

import torch


def effective_rank(sigma: torch.Tensor) -> float:
    s = sigma.detach().double().clamp_min(0)
    p = s / s.sum()
    p = p[p > 0]  # 0·log 0 = 0
    return float(torch.exp(-(p * p.log()).sum()))


def participation_ratio(sigma: torch.Tensor) -> float:
    s = sigma.detach().double().clamp_min(0)
    return float(s.sum() ** 2 / (s**2).sum())
