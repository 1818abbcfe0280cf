"""SigmaScale (arXiv 2606.07098, METHODS §D): learned row and column scalings around a truncated SVD.

    D_r = diag(exp d_r), D_c = diag(exp d_c)
    Ŵ   = D_r⁻¹ · SVD_k(D_r · W · D_c) · D_c⁻¹                       (differentiable torch.linalg.svd)
    min ‖WX − ŴX‖²_F / (m·n) + λ(‖d_r‖² + ‖d_c‖²),  λ = 1e-6,  AdamW lr 5e-3, ≤ 1000 full-batch steps, plateau stop
    init d ~ N(0, (0.1·std W)²);  store L = D_r⁻¹U_kΣ_k^½, R = Σ_k^½V_kᵀD_c⁻¹

X stands for all calibration inputs of the layer. Any X' with X'X'ᵀ = XXᵀ gives the same loss and gradient
(‖ΔX‖² = tr(ΔXXᵀΔᵀ)), so X is SVD-LLM's n×n Cholesky root S of the streamed Gram matrix: exact over every
calibration token, with memory n² however many tokens there are.

Beyond the paper (`init="svd_llm"`): the scalings act on the whitened matrix instead,
    Ŵ = D_r⁻¹ · SVD_k(D_r · W·S · D_c) · D_c⁻¹ · S⁻¹,   d = 0 at init,
which is SVD-LLM's solution at step 0, so with the best step kept it never ends worse than SVD-LLM. Since SVD-LLM is
already the exact optimum of this loss, the scalings cannot improve it; any gain must come from elsewhere (refine.py).
"""

from __future__ import annotations

import math

import torch

from scalelab.compress.methods import Factors, truncate, whitening


def _reconstruct(d_r: torch.Tensor, d_c: torch.Tensor, base: torch.Tensor, k: int) -> torch.Tensor:
    """D_r⁻¹ · SVD_k(D_r·base·D_c) · D_c⁻¹, differentiable in d_r and d_c."""
    r, c = d_r.exp(), d_c.exp()
    u, s, vh = torch.linalg.svd(r[:, None] * base * c, full_matrices=False)
    return (u[:, :k] * s[:k]) @ vh[:k] / r[:, None] / c


def sigmascale(weight: torch.Tensor, k: int, gram: torch.Tensor, *, lr: float = 5e-3, weight_decay: float = 0.0,
               lam: float = 1e-6, init_std: float = 0.1, max_steps: int = 1000, patience: int = 50,
               tol: float = 1e-3, init: str = "random", jitter: float = 1e-6,
               generator: torch.Generator | None = None) -> Factors:
    m, n = weight.shape
    w64 = weight.double()
    s_white, eps = whitening(gram, jitter)  # S Sᵀ = XXᵀ: the calibration inputs, n columns
    target64 = w64 @ s_white  # W·X
    whitened = init == "svd_llm"
    if init not in ("random", "svd_llm"):
        raise ValueError(f"sigmascale init {init!r}: expected 'random' or 'svd_llm'")
    # Optimise in float32 (SVD and its backward dominate); the final factors are rebuilt in float64.
    dev = weight.device
    target = target64.float()
    base = target if whitened else w64.float()  # the matrix the scalings act on
    x = None if whitened else s_white.float()  # loss = ‖(W − Ŵ)·X‖²; whitened: Ŵ·S is compared with W·S directly
    std = 0.0 if whitened else init_std * float(weight.float().std())
    d_r = torch.nn.Parameter(torch.randn(m, generator=generator, dtype=torch.float64).float().to(dev) * std)
    d_c = torch.nn.Parameter(torch.randn(n, generator=generator, dtype=torch.float64).float().to(dev) * std)
    opt = torch.optim.AdamW([d_r, d_c], lr=lr, weight_decay=weight_decay)

    best = (math.inf, d_r.detach().clone(), d_c.detach().clone())
    checkpoint, first, skipped, step = math.inf, None, 0, 0
    for step in range(1, max_steps + 1):
        low = _reconstruct(d_r, d_c, base, k)
        approx = low if whitened else low @ x
        loss = ((target - approx) ** 2).sum() / (m * n)
        objective = loss + lam * (d_r.square().sum() + d_c.square().sum())
        value = objective.item()
        if not math.isfinite(value):  # a degenerate spectrum can make the SVD's backward blow up: skip the step
            skipped += 1
            opt.zero_grad(set_to_none=True)
            if skipped > max_steps // 10:
                break
            continue
        first = value if first is None else first
        if value < best[0]:
            best = (value, d_r.detach().clone(), d_c.detach().clone())
        if step % patience == 0:  # plateau: the best improved by less than tol (relative) over `patience` steps
            if checkpoint - best[0] < tol * abs(best[0]):
                break
            checkpoint = best[0]
        opt.zero_grad(set_to_none=True)
        objective.backward()
        if not all(torch.isfinite(p.grad).all() for p in (d_r, d_c)):
            skipped += 1
            continue
        opt.step()

    # Rebuild the factors from the best scalings in float64: L = D_r⁻¹U_kΣ_k^½, R = Σ_k^½V_kᵀD_c⁻¹(·S⁻¹)
    r, c = best[1].double().exp(), best[2].double().exp()
    base64 = target64 if whitened else w64
    left, right, sigma = truncate(r[:, None] * base64 * c, k)
    left, right = left / r[:, None], right / c
    if whitened:
        right = torch.linalg.solve_triangular(s_white, right, upper=False, left=False)
    return Factors(left, right, sigma, {"steps": step, "skipped": skipped, "objective_init": first,
                                        "objective_best": best[0], "jitter": eps})
