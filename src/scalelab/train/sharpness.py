"""Sharpness (the scale-vector diagnostics): the top Hessian eigenvalue λ_max of the training cross-entropy by power
iteration on Hessian-vector products, and the callback that measures it during training in the folded plain-weight
parameterization, so that every variant is measured in the same coordinates."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from lightning.pytorch.callbacks import Callback
from torch.nn.attention import SDPBackend, sdpa_kernel

from scalelab.config import SharpnessConfig
from scalelab.model.export import fold_scales, plain_config
from scalelab.model.transformer import Transformer


class Eigen(NamedTuple):
    value: float  # λ_max
    iters: int  # Hessian-vector products used (both passes)
    converged: bool  # the last pass met the relative tolerance within its iterations


def power_iteration(hvp: Callable[[list[torch.Tensor]], list[torch.Tensor]], like: list[torch.Tensor],
                    max_iters: int, tol: float = 0.0, seed: int = 0) -> Eigen:
    """Largest eigenvalue λ_max of the symmetric operator `hvp` on tensors shaped like `like`.

    Power iteration v ← Hv/‖Hv‖ converges to the eigenvalue of largest magnitude. A pass stops when the residual of
    its unit vector and Rayleigh quotient λ, ‖Hv − λv‖, is at most `tol`·|λ|: then an eigenvalue of H lies within
    that relative distance of λ (for symmetric H, |λ − λ_i| ≤ ‖Hv − λv‖). tol 0 runs all `max_iters`. Away from a
    minimum the dominant eigenvalue can be negative; then a second pass on the shifted operator H − λI (dominant
    eigenvalue λ_max − λ ≥ 0) gives λ_max. The start vector comes from `seed`.
    """
    total = 0

    def run(shift: float) -> tuple[float, bool]:
        nonlocal total
        gen = torch.Generator().manual_seed(seed)
        v = [torch.randn(p.shape, generator=gen).to(p) for p in like]
        eig = 0.0
        for _ in range(max_iters):
            norm = torch.sqrt(sum((u * u).sum() for u in v))
            v = [u / norm for u in v]
            hv = [h - shift * u for h, u in zip(hvp(v), v)]  # (H − shift·I) v
            eig = sum((h * u).sum() for h, u in zip(hv, v)).item()  # Rayleigh quotient of the unit vector
            total += 1
            residual = torch.sqrt(sum(((h - eig * u) ** 2).sum() for h, u in zip(hv, v))).item()  # shift-free
            if residual <= tol * abs(eig + shift):
                return eig + shift, True
            v = hv
        return eig + shift, False

    dominant, converged = run(0.0)
    if dominant < 0:
        dominant, converged = run(dominant)
    return Eigen(dominant, total, converged)


def hessian_eigen(loss_fn: Callable[[], torch.Tensor], params: list[torch.Tensor], max_iters: int,
                  tol: float = 0.0, seed: int = 0) -> Eigen:
    """λ_max of the Hessian of `loss_fn()` w.r.t. `params` (the sharpness): power iteration on
    Hessian-vector products, each a second backward through one graph of first derivatives."""
    grads = torch.autograd.grad(loss_fn(), params, create_graph=True, allow_unused=True, materialize_grads=True)

    def hvp(v: list[torch.Tensor]) -> list[torch.Tensor]:
        return [h.detach() for h in torch.autograd.grad(grads, params, grad_outputs=v, retain_graph=True,
                                                         allow_unused=True, materialize_grads=True)]

    return power_iteration(hvp, params, max_iters, tol, seed)


def top_hessian_eigenvalue(loss_fn: Callable[[], torch.Tensor], params: list[torch.Tensor], iters: int,
                           seed: int = 0, tol: float = 0.0) -> float:
    """`hessian_eigen(...).value`: λ_max after at most `iters` iterations (all of them with tol 0)."""
    return hessian_eigen(loss_fn, params, iters, tol, seed).value


class Sharpness(Callback):
    """Top Hessian eigenvalue of the cross-entropy on a fixed batch of `cfg.tokens` training tokens, every
    `cfg.every` steps (None: the last step only) and at the end.

    Comparable across variants: the Hessian is taken in the folded plain-weight parameterization, i.e. w.r.t. the
    weights of `Transformer(plain_config(model))` loaded with `fold_scales(model)` (the Llama/Qwen3 export: the same
    parameter set for every variant, input-side γ folded into the matrices, magdir's g·v/‖v‖ as plain vectors). In a
    variant's own parameterization a magdir or placement model has other coordinates and so another Hessian for the
    same function. Cross-entropy only: the MoE load-balance term is not the loss whose curvature the claim is about.
    Float32, whatever the training precision. Every rank computes the same value on the same batch.
    """

    def __init__(self, cfg: SharpnessConfig, total: int) -> None:
        self.cfg, self.total = cfg, total
        self.rows: list[tuple[int, float, int, bool]] = []  # (step, λ_max, iterations, converged)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = pl_module.step
        due = step == self.total or (self.cfg.every is not None and step % self.cfg.every == 0)
        if self.cfg.enabled and due:
            dm = trainer.datamodule
            eig = self.measure(pl_module.model, dm.sharpness_batch(self.cfg.tokens // dm.cfg.seq_len),
                               pl_module.device)
            pl_module.step_metrics.update({"sharpness": eig.value, "sharpness_iters": eig.iters})
            self.rows.append((step, eig.value, eig.iters, eig.converged))

    def measure(self, model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor],
                device: torch.device | str = "cpu") -> Eigen:
        x, y = (t.to(device) for t in batch)
        plain = Transformer(plain_config(model)).to(device)
        plain.load_state_dict({k: v.float() for k, v in fold_scales(model).items()})
        params = list(plain.parameters())

        def ce() -> torch.Tensor:
            logits = plain(x).logits.float()
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

        # the math SDPA kernel is the one with a second derivative (the fused CPU/flash kernels have none)
        with sdpa_kernel(SDPBackend.MATH), torch.enable_grad():
            return hessian_eigen(ce, params, self.cfg.max_iters, self.cfg.tol)

    def summary(self) -> dict[str, float | int | bool | None]:
        step, value, iters, converged = self.rows[-1] if self.rows else (None, None, None, None)
        return {"sharpness": value, "sharpness_iters": iters, "sharpness_converged": converged}

    def state_dict(self) -> dict:
        return {"rows": self.rows}

    def load_state_dict(self, state_dict: dict) -> None:
        self.rows = [tuple(r) for r in state_dict["rows"]]
