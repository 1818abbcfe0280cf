"""SigmaScale's closed-form baselines (docs/compression.md), each a truncated SVD of a rescaled W, the scaling undone
afterwards.

For W ∈ R^{m×n} (out × in) and rank k, every method returns factors L ∈ R^{m×k}, R ∈ R^{k×n} with Ŵ = L·R:

    plain SVD   W = UΣVᵀ;                   L = U_kΣ_k^½,          R = Σ_k^½V_kᵀ
    ASVD        S = diag(mean|x|)^α;        SVD of W·S,            R ← R·S⁻¹       (arXiv 2312.05821, α = 0.5)
    SVD-LLM     C = Σ x xᵀ, S = chol(C);   SVD of W·S,            R ← R·S⁻¹       (arXiv 2403.07378)
    FWSVD       I_i = Σ_j F_ij (Fisher);    SVD of diag(√I)·W,     L ← diag(√I)⁻¹·L (Hsu et al. 2022)

The layer loss every method is judged by is ‖WX − ŴX‖²_F/(m·n) over all calibration inputs X, computed from
C = XXᵀ as tr(ΔCΔᵀ)/(m·n), Δ = W − Ŵ. With C = SSᵀ it is ‖ΔS‖²_F, so SVD-LLM's Ŵ is its exact minimiser (Eckart–Young
on W·S) and its loss is the sum of the discarded σ² of W·S, divided by m·n.

Precision. Plain SVD, ASVD and FWSVD factor a rescaled W in float32, the precision of the weights they replace: an
SVD is backward stable, so the factorisation's error is float32's rounding of W·S itself, far below the truncation's
(tests/test_compress_cost.py pins their layer loss to float64's, on inputs whose Gram has condition number ~7e10).
SVD-LLM alone stays in float64: it is the reference every layer loss is read against (its loss at rank k is the
layer-wise optimum, Calibration.best_loss), and its Cholesky factor S and the solve by S carry C's condition number,
the square of the inputs'.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

EPS = 1e-12  # floor for scales: a dead input channel (mean|x| = 0) or a row with zero Fisher information


@dataclass
class Factors:
    """Ŵ = left @ right; `sigma` is the full spectrum of the (scaled) matrix that was truncated."""

    left: torch.Tensor  # m × k
    right: torch.Tensor  # k × n
    sigma: torch.Tensor
    info: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.left.shape[1]


def truncate(matrix: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """L = U_kΣ_k^½, R = Σ_k^½V_kᵀ of the best rank-k approximation, and all singular values."""
    u, s, vh = torch.linalg.svd(matrix, full_matrices=False)
    root = s[:k].sqrt()
    return u[:, :k] * root, root[:, None] * vh[:k], s


def whitening(gram: torch.Tensor, jitter: float = 1e-6, tries: int = 8) -> tuple[torch.Tensor, float]:
    """SVD-LLM's S = cholesky(C), lower triangular with SSᵀ = C; when C is singular (fewer tokens than inputs, dead
    channels) a jitter ε·mean(diag C)·I is added, ε growing tenfold until the factorisation succeeds. Returns (S, ε)."""
    c = gram.double()
    s, info = torch.linalg.cholesky_ex(c)
    if info == 0:
        return s, 0.0
    scale = float(c.diagonal().mean().clamp_min(EPS))
    eye = torch.eye(c.shape[0], dtype=c.dtype, device=c.device)
    eps = jitter
    for _ in range(tries):
        s, info = torch.linalg.cholesky_ex(c + eps * scale * eye)
        if info == 0:
            return s, eps
        eps *= 10
    raise ValueError(f"calibration Gram matrix is not positive definite even with jitter {eps / 10:g}")


def layer_loss(weight: torch.Tensor, left: torch.Tensor, right: torch.Tensor, gram: torch.Tensor) -> float:
    """‖WX − ŴX‖²_F / (m·n) over the calibration inputs, from their Gram C = XXᵀ."""
    delta = weight.double() - left.double() @ right.double()
    m, n = weight.shape
    return float(((delta @ gram.double()) * delta).sum() / (m * n))


def plain_svd(weight: torch.Tensor, k: int) -> Factors:
    left, right, s = truncate(weight.float(), k)
    return Factors(left, right, s)


def asvd(weight: torch.Tensor, k: int, abs_mean: torch.Tensor, alpha: float = 0.5) -> Factors:
    """Activation-aware SVD: columns scaled by S = diag(mean|x|)^α before truncation (α = 0: plain SVD)."""
    scale = abs_mean.float().clamp_min(EPS) ** alpha
    left, right, s = truncate(weight.float() * scale, k)  # W·S
    return Factors(left, right / scale, s)  # R·S⁻¹


def svd_llm(weight: torch.Tensor, k: int, gram: torch.Tensor, jitter: float = 1e-6, *,
            root: tuple[torch.Tensor, float] | None = None) -> Factors:
    """Truncation-aware whitening: SVD of W·S with S = chol(XXᵀ); Ŵ = SVD_k(W·S)·S⁻¹ minimises the layer loss.
    `root`: (S, ε) as `whitening(gram, jitter)` returns it, when already computed (calibrate.Stats.whitening)."""
    s_white, eps = root if root is not None else whitening(gram, jitter)
    left, right, s = truncate(weight.double() @ s_white, k)
    right = torch.linalg.solve_triangular(s_white, right, upper=False, left=False)  # R·S⁻¹
    return Factors(left, right, s, {"jitter": eps})


def svd_llm_loss(weight: torch.Tensor, k: int, gram: torch.Tensor, jitter: float = 1e-6) -> float:
    """SVD-LLM's layer loss in closed form: Σ_{i>k} σ_i(W·S)² / (m·n), the optimum any method is compared with."""
    s_white, _ = whitening(gram, jitter)
    s = torch.linalg.svdvals(weight.double() @ s_white)
    m, n = weight.shape
    return float((s[k:] ** 2).sum() / (m * n))


def fwsvd(weight: torch.Tensor, k: int, fisher_rows: torch.Tensor) -> Factors:
    """Fisher-weighted SVD: rows weighted by √I_i, I_i = Σ_j E[(∂ℓ/∂W_ij)²] over calibration sequences."""
    scale = fisher_rows.float().clamp_min(EPS).sqrt()[:, None]
    left, right, s = truncate(scale * weight.float(), k)
    return Factors(left / scale, right, s)
