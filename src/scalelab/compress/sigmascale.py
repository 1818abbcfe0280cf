"""SigmaScale (arXiv 2606.07098, METHODS §D): learned row and column scalings around a truncated SVD.

    D_r = diag(exp d_r), D_c = diag(exp d_c),  M = D_r · W · D_c
    Ŵ   = D_r⁻¹ · SVD_k(M) · D_c⁻¹
    min ‖WX − ŴX‖²_F / (m·n) + λ(‖d_r‖² + ‖d_c‖²),  λ = 1e-6,  AdamW lr 5e-3, ≤ 1000 full-batch steps, plateau stop
    init d ~ N(0, (0.1·std W)²);  store L = D_r⁻¹U_kΣ_k^½, R = Σ_k^½V_kᵀD_c⁻¹

X enters only through C = XXᵀ (‖ΔX‖² = tr(ΔCΔᵀ)): exact over every calibration token, memory n².

The fast step (`scaled_loss`, the one the optimiser uses) is the same loss, computed without an SVD. SVD_k(M) is M
projected on its top-k singular subspace, so only the discarded subspace matters: for m ≤ n, with U_b (m × (m−k))
the bottom eigenvectors of the small Gram MMᵀ (`torch.linalg.eigh`, differentiable),
    Ŵ = D_r⁻¹(I − U_bU_bᵀ)D_r W,   ‖(W − Ŵ)X‖² = tr[(U_bᵀD_r⁻²U_b)(U_bᵀD_r K D_r U_b)],   K = W C Wᵀ (fixed)
and for m > n, with V_b the bottom eigenvectors of MᵀM,
    Ŵ = W D_c(I − V_bV_bᵀ)D_c⁻¹,   ‖(W − Ŵ)X‖² = tr[(V_bᵀD_c H D_c V_b)(V_bᵀD_c⁻¹C D_c⁻¹V_b)],   H = WᵀW (fixed).
Per step: one min(m,n)² Gram, one symmetric eigendecomposition of it and products of its size, no n×n product with
the calibration root and no cancellation (the loss is the residual energy itself). `svd_loss` is the paper's form
(differentiable full SVD), kept as the reference the fast step is tested and benchmarked against.

Beyond the paper (`init="svd_llm"`): the column scalings start at the diagonal of SVD-LLM's whitening,
d_c = ½·log(diag C / mean diag C) (so D_c ≈ diag(C)^½: ASVD-like with α from the Gram), d_r = 0, and the paper's
optimiser runs from there. (The earlier variant, scalings on the fully whitened W·S from d = 0, started at SVD-LLM's
exact optimum of the same loss and could not move: dropped.)

Stopping (the official code's rule, train_utils/svd_smoother.py): after more than 2·`patience` steps, stop when the
mean loss of the last `patience` steps is no lower than that of the `patience` before by more than `tol` (relative
here: the official threshold 1e-4 is absolute in its own loss units), or is higher (the loss rising). A run that
reaches `max_steps` instead is recorded as stopped by the cap: unconverged.
"""

from __future__ import annotations

import math

import torch

from scalelab.compress.methods import Factors, truncate


def problem_of(weight: torch.Tensor, gram: torch.Tensor, dtype: torch.dtype = torch.float32) -> dict:
    """The fixed matrices of the fast loss for this map (float64 products, then rounded to `dtype`: the optimiser
    runs in float32, where the SVD or eigendecomposition and its backward are fast and exact enough)."""
    w, c = weight.double(), gram.double()
    m, n = w.shape
    if m <= n:
        return {"rows": True, "w": w.to(dtype), "k_mat": (w @ c @ w.T).to(dtype)}
    return {"rows": False, "w": w.to(dtype), "h_mat": (w.T @ w).to(dtype), "c_mat": c.to(dtype)}


class _Discarded(torch.autograd.Function):
    """The eigenvectors of the q smallest eigenvalues of a symmetric A, with the gradient of a function of their span
    only. Perturbation theory: du_j = Σ_{i≠j} u_i (u_iᵀ dA u_j)/(λ_j − λ_i); for a loss invariant to rotations inside
    the span, the terms with i in the span cancel, leaving ∂L/∂A = sym(U_t X U_bᵀ), X_ij = (U_tᵀG)_ij/(λ_b,j − λ_t,i).
    `torch.linalg.eigh`'s own backward keeps every pair, and pairs of (near-)equal eigenvalues inside either block
    give inf·0 = NaN although their true contribution is zero; only the gap at the cut enters here."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, q: int) -> torch.Tensor:
        lam, u = torch.linalg.eigh(a)  # ascending
        ctx.save_for_backward(lam, u)
        ctx.q = q
        return u[:, :q]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        lam, u = ctx.saved_tensors
        q = ctx.q
        ub, ut = u[:, :q], u[:, q:]
        x = (ut.T @ grad) / (lam[None, :q] - lam[q:, None])
        g = ut @ x @ ub.T
        return (g + g.T) / 2, None


def scaled_loss(d_r: torch.Tensor, d_c: torch.Tensor, problem: dict, k: int) -> torch.Tensor:
    """‖(W − Ŵ)X‖²_F (not yet divided by m·n) through the eigendecomposition of the scaled matrix's small Gram."""
    r, c, w = d_r.exp(), d_c.exp(), problem["w"]
    m = r[:, None] * w * c
    if problem["rows"]:
        ub = _Discarded.apply(m @ m.T, w.shape[0] - k)  # the m − k discarded directions
        left = ub.T @ (ub / r[:, None] ** 2)
        right = (ub * r[:, None]).T @ problem["k_mat"] @ (ub * r[:, None])
    else:
        vb = _Discarded.apply(m.T @ m, w.shape[1] - k)
        left = (vb * c[:, None]).T @ problem["h_mat"] @ (vb * c[:, None])
        right = (vb / c[:, None]).T @ problem["c_mat"] @ (vb / c[:, None])
    return (left * right).sum()  # tr(AB) for symmetric A, B


def svd_loss(d_r: torch.Tensor, d_c: torch.Tensor, weight: torch.Tensor, root: torch.Tensor, k: int) -> torch.Tensor:
    """The paper's form of the same quantity: ‖W·S − D_r⁻¹SVD_k(D_rWD_c)D_c⁻¹·S‖², S Sᵀ = C, full differentiable SVD."""
    r, c = d_r.exp(), d_c.exp()
    u, s, vh = torch.linalg.svd(r[:, None] * weight * c, full_matrices=False)
    low = (u[:, :k] * s[:k]) @ vh[:k] / r[:, None] / c
    return ((weight @ root - low @ root) ** 2).sum()


def plateaued(history: list[float], patience: int, tol: float) -> str | None:
    """The official stopping rule on the loss history: 'plateau', 'rising' or None (go on)."""
    if len(history) <= 2 * patience:
        return None
    recent = sum(history[-patience:]) / patience
    before = sum(history[-2 * patience : -patience]) / patience
    if recent > before:
        return "rising"
    if before - recent < tol * abs(before):
        return "plateau"
    return None


def sigmascale(weight: torch.Tensor, k: int, gram: torch.Tensor, *, lr: float = 5e-3, weight_decay: float = 0.0,
               lam: float = 1e-6, init_std: float = 0.1, max_steps: int = 1000, patience: int = 50,
               tol: float = 1e-3, init: str = "random", generator: torch.Generator | None = None) -> Factors:
    """SigmaScale's factors of one map; `info` records its convergence: steps, the objective at the first and at the
    best step, their ratio, and why it stopped ('plateau', 'rising', 'cap' or 'nonfinite')."""
    m, n = weight.shape
    dev = weight.device
    problem = {key: (v.to(dev) if isinstance(v, torch.Tensor) else v) for key, v in problem_of(weight, gram).items()}
    if init not in ("random", "svd_llm"):
        raise ValueError(f"sigmascale init {init!r}: expected 'random' or 'svd_llm'")
    std = init_std * float(weight.float().std())
    d_r = torch.nn.Parameter(torch.randn(m, generator=generator, dtype=torch.float64).float().to(dev) * std)
    d_c = torch.nn.Parameter(torch.randn(n, generator=generator, dtype=torch.float64).float().to(dev) * std)
    if init == "svd_llm":  # beyond the paper: the diagonal of SVD-LLM's whitening, diag(C)^½ up to scale, on the inputs
        diag = gram.double().diagonal().clamp_min(1e-30)
        with torch.no_grad():
            d_r.zero_()
            d_c.copy_((0.5 * (diag / diag.mean()).log()).float().to(dev))
    opt = torch.optim.AdamW([d_r, d_c], lr=lr, weight_decay=weight_decay)

    best = (math.inf, d_r.detach().clone(), d_c.detach().clone())
    history: list[float] = []
    skipped, stop, step = 0, "cap", 0
    for step in range(1, max_steps + 1):
        loss = scaled_loss(d_r, d_c, problem, k) / (m * n)
        objective = loss + lam * (d_r.square().sum() + d_c.square().sum())
        value = objective.item()
        opt.zero_grad(set_to_none=True)
        if math.isfinite(value):
            objective.backward()
        if not math.isfinite(value) or not all(torch.isfinite(p.grad).all() for p in (d_r, d_c)):
            # a degenerate gap at the cut can still make the backward blow up: skip the step
            skipped += 1
            if skipped > max_steps // 10:
                stop = "nonfinite"
                break
            continue
        history.append(value)
        if value < best[0]:
            best = (value, d_r.detach().clone(), d_c.detach().clone())
        if (stop_reason := plateaued(history, patience, tol)) is not None:
            stop = stop_reason
            break
        opt.step()

    # Rebuild the factors from the best scalings in float64: L = D_r⁻¹U_kΣ_k^½, R = Σ_k^½V_kᵀD_c⁻¹
    r, c = best[1].double().exp(), best[2].double().exp()
    left, right, sigma = truncate(r[:, None] * weight.double() * c, k)
    first = history[0] if history else math.nan
    return Factors(left / r[:, None], right / c, sigma,
                   {"steps": step, "skipped": skipped, "stop": stop, "objective_init": first,
                    "objective_best": best[0], "best_over_init": best[0] / first if history and first else math.nan})
