"""SigmaScale (arXiv 2606.07098; docs/compression.md): learned row and column scalings around a truncated SVD.

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

Initial scalings (`initial_scalings`): the paper's d ~ N(0, (0.1·std W)²), drawn from the map's own generator
(keys.map_generator: d_r first, then d_c), so a map starts the same whatever else the allocation compresses. Beyond
the paper, two warm starts with d_r = 0: `svd_llm`, the diagonal of SVD-LLM's whitening, d_c = ½·log(diag C / mean
diag C) (D_c ≈ diag(C)^½); `asvd`, ASVD's scaling d_c = α·log(mean|x|), centred (a common factor of D_c cancels in
Ŵ), where step 0 is exactly ASVD's factorisation. (An earlier variant, scalings on the fully whitened W·S from d = 0,
started at SVD-LLM's exact optimum of the same loss and could not move: dropped.)

Stopping (`stop`):
    plateau  the rule the official code defines (train_utils/svd_smoother.py): after more than 2·`patience` steps, stop
             when the mean loss of the last `patience` steps is no lower than that of the `patience` before by more
             than `tol` (relative here: the official threshold 1e-4 is absolute in its own loss units), or is higher
             (rising); the best scalings seen are kept. A run that reaches `max_steps` first stops by the cap:
             unconverged.
    fixed    as the official code's live path runs (its early stop is commented out): `max_steps` AdamW steps, the
             scalings after the last step kept. The step where the plateau rule would have fired, and the best
             scalings up to it (what `plateau` would have returned: the trajectory is the same), are kept beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


INITS = ("random", "svd_llm", "asvd")


def initial_scalings(weight: torch.Tensor, *, init: str = "random", init_std: float = 0.1,
                     generator: torch.Generator | None = None, gram: torch.Tensor | None = None,
                     abs_mean: torch.Tensor | None = None, alpha: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_r, d_c) in float32 on the CPU at step 0 (module docstring); `random` draws d_r then d_c from `generator`."""
    if init not in INITS:
        raise ValueError(f"sigmascale init {init!r}: expected one of {INITS}")
    m, n = weight.shape
    if init == "random":
        std = init_std * float(weight.detach().float().std())
        d_r = torch.randn(m, generator=generator, dtype=torch.float64).float() * std
        d_c = torch.randn(n, generator=generator, dtype=torch.float64).float() * std
    elif init == "svd_llm":
        if gram is None:
            raise ValueError("sigmascale init 'svd_llm' needs the calibration Gram matrix")
        diag = gram.double().diagonal().clamp_min(1e-30).cpu()
        d_r, d_c = torch.zeros(m), (0.5 * (diag / diag.mean()).log()).float()
    elif init == "asvd":
        if abs_mean is None:
            raise ValueError("sigmascale init 'asvd' needs the inputs' mean |x|")
        log_s = alpha * abs_mean.double().clamp_min(1e-12).log().cpu()
        d_r, d_c = torch.zeros(m), (log_s - log_s.mean()).float()
    return d_r, d_c


@dataclass
class Run:
    """One optimisation: the kept scalings, its convergence record, and the alternatives it passed through
    (`best`: lowest objective seen; `last`: after the final step; `plateau`: the best up to the step the plateau rule
    fired, None if it never did)."""

    d_r: torch.Tensor
    d_c: torch.Tensor
    info: dict
    alternatives: dict = field(default_factory=dict)


def _objective(d_r, d_c, problem, k, lam, mn) -> torch.Tensor:
    return scaled_loss(d_r, d_c, problem, k) / mn + lam * (d_r.square().sum() + d_c.square().sum())


def optimise(weight: torch.Tensor, k: int, gram: torch.Tensor, d_r0: torch.Tensor, d_c0: torch.Tensor, *,
             lr: float = 5e-3, weight_decay: float = 0.0, lam: float = 1e-6, max_steps: int = 1000, patience: int = 50,
             tol: float = 1e-3, stop: str = "plateau") -> Run:
    """AdamW on the log-scales from (d_r0, d_c0) under the stopping rule `stop` (module docstring). `info`: steps
    taken, skipped (non-finite) steps, why it stopped ('plateau', 'rising', 'cap', 'fixed' or 'nonfinite'), which
    iterate was kept, the objective at step 0, at the best step and at the kept scalings, and the plateau step."""
    if stop not in ("plateau", "fixed"):
        raise ValueError(f"sigmascale stop {stop!r}: expected 'plateau' or 'fixed'")
    m, n = weight.shape
    dev = weight.device
    problem = {key: (v.to(dev) if isinstance(v, torch.Tensor) else v) for key, v in problem_of(weight, gram).items()}
    d_r = torch.nn.Parameter(d_r0.detach().float().to(dev).clone())
    d_c = torch.nn.Parameter(d_c0.detach().float().to(dev).clone())
    opt = torch.optim.AdamW([d_r, d_c], lr=lr, weight_decay=weight_decay)

    def snap() -> tuple[torch.Tensor, torch.Tensor]:
        return d_r.detach().cpu().clone(), d_c.detach().cpu().clone()

    best, best_value = snap(), math.inf
    plateau: tuple | None = None
    plateau_step = None
    history: list[float] = []
    skipped, reason, step = 0, "cap" if stop == "plateau" else "fixed", 0
    for step in range(1, max_steps + 1):
        objective = _objective(d_r, d_c, problem, k, lam, m * n)
        value = objective.item()
        opt.zero_grad(set_to_none=True)
        if math.isfinite(value):
            objective.backward()
        if not math.isfinite(value) or not all(torch.isfinite(p.grad).all() for p in (d_r, d_c)):
            # a degenerate gap at the cut can still make the backward blow up: skip the step
            skipped += 1
            if skipped > max_steps // 10:
                reason = "nonfinite"
                break
            continue
        history.append(value)
        if value < best_value:
            best, best_value = snap(), value
        if plateau_step is None and (fired := plateaued(history, patience, tol)) is not None:
            plateau_step, plateau = step, (best, fired, best_value, skipped)
            if stop == "plateau":
                reason = fired
                break
        opt.step()

    with torch.no_grad():
        last_value = _objective(d_r, d_c, problem, k, lam, m * n).item()
    last = snap()
    keep_last = stop == "fixed" and reason == "fixed" and math.isfinite(last_value)
    kept, kept_value = (last, last_value) if keep_last else (best, best_value)
    first = history[0] if history else math.nan
    info = {"steps": step, "skipped": skipped, "stop": reason, "kept": "last" if keep_last else "best",
            "objective_init": first, "objective_best": best_value, "objective_kept": kept_value,
            "best_over_init": best_value / first if history and first else math.nan,
            "plateau_step": plateau_step, "plateau_rule": plateau[1] if plateau else None,
            "objective_plateau": plateau[2] if plateau else None, "skipped_plateau": plateau[3] if plateau else None}
    alternatives = {"best": best, "last": last, "plateau": plateau[0] if plateau else None}
    return Run(kept[0], kept[1], info, alternatives)


def plateau_answer(run: Run, max_steps: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """What `stop: plateau` returns on the trajectory a `stop: fixed` run of `max_steps` took (the same steps up to
    where the rule fires): (d_r, d_c, info) as `optimise` would give them, but `seconds_optimise`."""
    i = run.info
    first = i["objective_init"]
    if i["plateau_step"] is not None:  # the rule fired: the best up to there
        (d_r, d_c), value = run.alternatives["plateau"], i["objective_plateau"]
        rest = {"steps": i["plateau_step"], "skipped": i["skipped_plateau"], "stop": i["plateau_rule"]}
    else:  # it never fired: the cap (or the non-finite steps that ended both), the best seen
        (d_r, d_c), value = run.alternatives["best"], i["objective_best"]
        rest = {"steps": i["steps"] if i["stop"] == "nonfinite" else max_steps, "skipped": i["skipped"],
                "stop": "nonfinite" if i["stop"] == "nonfinite" else "cap"}
    info = {**rest, "kept": "best", "objective_init": first, "objective_best": value, "objective_kept": value,
            "best_over_init": value / first if first else math.nan, "plateau_step": i["plateau_step"],
            "plateau_rule": i["plateau_rule"], "objective_plateau": i["objective_plateau"],
            "skipped_plateau": i["skipped_plateau"]}
    return d_r, d_c, info


def factors_of(weight: torch.Tensor, k: int, d_r: torch.Tensor, d_c: torch.Tensor, info: dict | None = None) -> Factors:
    """The factors of scalings (d_r, d_c), rebuilt in float64: L = D_r⁻¹U_kΣ_k^½, R = Σ_k^½V_kᵀD_c⁻¹."""
    r = d_r.double().to(weight.device).exp()
    c = d_c.double().to(weight.device).exp()
    left, right, sigma = truncate(r[:, None] * weight.double() * c, k)
    return Factors(left / r[:, None], right / c, sigma, dict(info or {}))


def sigmascale(weight: torch.Tensor, k: int, gram: torch.Tensor, *, lr: float = 5e-3, weight_decay: float = 0.0,
               lam: float = 1e-6, init_std: float = 0.1, max_steps: int = 1000, patience: int = 50,
               tol: float = 1e-3, stop: str = "plateau", init: str = "random",
               generator: torch.Generator | None = None, abs_mean: torch.Tensor | None = None,
               alpha: float = 0.5) -> Factors:
    """SigmaScale's factors of one map: initial scalings, the optimisation, the factors of the kept scalings; `info`
    records its convergence (`optimise`)."""
    d_r, d_c = initial_scalings(weight, init=init, init_std=init_std, generator=generator, gram=gram,
                                abs_mean=abs_mean, alpha=alpha)
    run = optimise(weight, k, gram, d_r, d_c, lr=lr, weight_decay=weight_decay, lam=lam, max_steps=max_steps,
                   patience=patience, tol=tol, stop=stop)
    return factors_of(weight, k, run.d_r, run.d_c, run.info)
