"""The benchmark's optimizer families (docs/optimizers.md), one per family at least, registered in
scalelab.optim.registry.

Library choice. torch.optim for SGD, AdamW, Adafactor and Muon; pytorch-optimizer (4.1.0) for the other nine, since
it is the one library that has all of them (heavyball 3.2.1 has SOAP, AdEMAMix and Schedule-Free AdamW but no Lion,
Sophia, Adam-mini or GaLore), plain eager PyTorch (heavyball compiles every update with torch.compile: its first
step took 67 s on these CPUs for Schedule-Free AdamW, and its uncompiled steps were no faster), one API with
external Hessian estimates for Sophia (`step(hessian=...)`) and optimizer.eval()/train() for Schedule-Free, and state
held in tensors (a checkpoint round trip without pickled objects, GaLore's projector aside: see `GaLore`).

Grouping (scalelab.optim.registry): element-wise families take the hidden matrices and the embeddings/LM head;
matrix families (Muon, SOAP, GaLore: a preconditioner or projection per matrix) take the hidden 2-D matrices only and
leave embeddings and LM head to AdamW, as Muon's authors do (and a vocabulary-sized SOAP preconditioner would need an
eigendecomposition of a V×V matrix); scale vectors always go to AdamW. Defaults below are each paper's or library's;
`optim.<name>.kwargs` overrides any library argument, and `optim.<name>.lr` is the centre of the benchmark's LR grid.
"""

from __future__ import annotations

import pytorch_optimizer as po
import torch
import torch.optim._muon as _torch_muon
from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector
from torch import nn

from scalelab.config import OptimizerConfig
from scalelab.optim.registry import OptimizerSpec, register


def _sgd(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Classical first-order: SGD with Nesterov momentum (torch's weight decay here is coupled L2)."""
    kwargs = {"nesterov": True, **cfg.kwargs}
    return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, **kwargs)


def _adafactor(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Memory-efficient: Adafactor (Shazeer & Stern 2018) as in torch.optim: factored second moment (row and column
    statistics of each matrix), β2 schedule 1 − t^−0.8, relative step min(lr, 1/√t)·RMS(θ), no first moment."""
    return torch.optim.Adafactor(groups, lr=cfg.lr, **cfg.kwargs)


def _newton_schulz_fp32(grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int,
                        eps: float) -> torch.Tensor:
    """torch.optim.Muon's Newton-Schulz iteration (the same quintic steps, the same coefficients) in float32."""
    a, b, c = ns_coefficients
    tall = grad.size(0) > grad.size(1)
    x = grad.float().T if tall else grad.float()
    x = x / x.norm().clamp(min=eps)
    for _ in range(ns_steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


class Muon(torch.optim.Muon):
    """torch.optim.Muon, with its Newton-Schulz iteration in float32 on the CPU. torch runs it in bfloat16, the fast
    path on GPUs; on CPUs without bfloat16 matmul units (these: AVX2 only) a bfloat16 matmul is ~100x slower than a
    float32 one, and Muon's step took 2 s for the `s` model against AdamW's 4 ms. On GPUs it is torch's as is."""

    def step(self, closure=None):
        if any(p.device.type != "cpu" for g in self.param_groups for p in g["params"]):
            return super().step(closure)
        bf16, _torch_muon._zeropower_via_newtonschulz = _torch_muon._zeropower_via_newtonschulz, _newton_schulz_fp32
        try:
            return super().step(closure)
        finally:
            _torch_muon._zeropower_via_newtonschulz = bf16


def _muon(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Matrix-based: Muon, Nesterov momentum orthogonalised by 5 Newton-Schulz steps. Moonshot's RMS matching
    (arXiv 2502.16982): update scaled by 0.2·sqrt(max(A, B)), so AdamW's lr and wd carry over."""
    kwargs = {"adjust_lr_fn": "match_rms_adamw", **cfg.kwargs}
    return Muon(groups, lr=cfg.lr, momentum=cfg.momentum, **kwargs)


def _lion(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Sign-based/discovered: Lion (Chen et al. 2023), sign(β1·m + (1−β1)·g) with decoupled decay; its paper's rule is
    an LR 3-10x below AdamW's and a decay 3-10x above (params set both)."""
    return po.Lion(groups, lr=cfg.lr, betas=cfg.betas, **{"weight_decouple": True, **cfg.kwargs})


def _signum(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Sign-based: Signum (Bernstein et al. 2018), SignSGD on the momentum, decoupled decay."""
    return po.SignSGD(groups, lr=cfg.lr, momentum=cfg.momentum, **{"weight_decouple": True, **cfg.kwargs})


def _soap(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Second-order/curvature: SOAP (Vyas et al. 2024), Adam in the eigenbasis of Shampoo's preconditioner,
    refreshed every 10 steps (the paper's frequency); decoupled decay."""
    kwargs = {"precondition_frequency": 10, **cfg.kwargs}
    return po.SOAP(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


def _sophia(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Second-order: Sophia (Liu et al. 2023), clip(m / max(h, eps), ±p) with h an EMA of diagonal Hessian estimates
    taken every `update_period` steps. The estimates come from the training loop (scalelab.optim.hooks: the
    Gauss-Newton-Bartlett estimator, i.e. Sophia-G, the paper's choice for LLMs) through `step(hessian=...)`.
    In pytorch-optimizer's parameterisation the per-coordinate step is at most lr·p: its default lr 0.06, p 0.01
    is Sophia-G's lr 6e-4 with ρ = p (update lr·sign(m)·min(|m|/(ρh), 1))."""
    kwargs = {"p": 1e-2, "update_period": 10, "weight_decouple": True, **cfg.kwargs}
    return po.SophiaH(groups, lr=cfg.lr, betas=cfg.betas, **kwargs)


class _Named:
    """What AdamMini reads of a model: `named_parameters()`, here only the parameters our grouping gives it, with the
    query/key projections renamed to the names its partition looks for (`q_proj`, `k_proj`: one block per head)."""

    def __init__(self, named: list[tuple[str, nn.Parameter]]) -> None:
        self._named = named

    def named_parameters(self):
        return iter(self._named)


def _adam_mini(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Memory-efficient: Adam-mini (Zhang et al. 2024) as pytorch-optimizer ports it: one second-moment scalar per
    block, blocks = each query/key head, each whole remaining matrix; embeddings and LM head keep Adam's
    per-coordinate v. Its groups are one per parameter (the partition is by name), all at `cfg.lr`."""
    c = model.cfg
    if c.n_head * c.head_dim != c.d_model:
        raise ValueError("adam_mini partitions q/k into n_head blocks of d_model·head_dim: needs n_head·head_dim = d")
    names = {id(p): n for n, p in model.named_parameters()}
    rename = {".attn.q.weight": ".attn.q_proj.weight", ".attn.k.weight": ".attn.k_proj.weight"}
    named = []
    for g in groups:
        if g["weight_decay"] != cfg.weight_decay:
            raise ValueError(f"adam_mini decays every parameter it takes at one rate; group {g['name']!r} differs")
        for p in g["params"]:
            n = names[id(p)]
            named.append((next((n.replace(a, b) for a, b in rename.items() if n.endswith(a)), n), p))
    kwargs = {"num_embeds": c.d_model, "num_heads": c.n_head, "num_query_groups": c.kv_heads, **cfg.kwargs}
    return po.AdamMini(_Named(named), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                       **kwargs)


class GaLore(po.GaLore):
    """pytorch-optimizer's GaLore whose per-matrix projector (a Python object in its state) is saved as a dict of
    tensors and numbers, so a checkpoint loads weights-only and resumes with the same projection."""

    FIELDS = ("rank", "update_proj_gap", "scale", "projection_type", "ortho_matrix", "last_svd_step")

    def state_dict(self) -> dict:
        sd = super().state_dict()  # its per-parameter dicts are the live ones: copy before replacing the projector
        sd["state"] = {k: ({**s, "projector": {f: getattr(s["projector"], f) for f in self.FIELDS}}
                           if isinstance(s.get("projector"), GaLoreProjector) else s) for k, s in sd["state"].items()}
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        for s in self.state.values():
            if isinstance(saved := s.get("projector"), dict):
                proj = GaLoreProjector(saved["rank"], saved["update_proj_gap"], saved["scale"], saved["projection_type"])
                proj.ortho_matrix, proj.last_svd_step = saved["ortho_matrix"], saved["last_svd_step"]
                s["projector"] = proj


def _galore(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Low-rank/projection: GaLore (Zhao et al. 2024), Adam on gradients projected to the top `rank` singular
    directions, refreshed every `update_proj_gap` steps and scaled by `scale` on the way back. The paper's setting:
    rank a quarter of the matrix's smaller side (128 at d = 512), gap 200, scale 0.25; decoupled decay."""
    kwargs = {"rank_ratio": 0.25, "update_proj_gap": 200, "scale": 0.25, "projection_type": "std", **cfg.kwargs}
    ratio = kwargs.pop("rank_ratio")
    proj = {k: kwargs.pop(k) for k in ("update_proj_gap", "scale", "projection_type")}
    by_rank: list[dict] = []
    for g in groups:  # one group per (source group, rank): GaLore's rank is a group setting
        ranks: dict[int, list] = {}
        for p in g["params"]:
            ranks.setdefault(max(1, round(min(p.shape) * ratio)), []).append(p)
        by_rank += [{**g, "params": ps, "rank": r, **proj} for r, ps in ranks.items()]
    return GaLore(by_rank, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


def _ademamix(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Adaptive: AdEMAMix (Pagliardini et al. 2024), Adam plus a slow EMA (β3) of gradients mixed in with weight α;
    decoupled decay. `beta3` (kwarg, default 0.9999) joins `betas`; `t_alpha_beta3` warms α and β3 up (the paper
    sets it to the run length)."""
    kwargs = {"alpha": 5.0, "weight_decouple": True, **cfg.kwargs}
    beta3 = kwargs.pop("beta3", 0.9999)
    return po.AdEMAMix(groups, lr=cfg.lr, betas=(*cfg.betas, beta3), eps=cfg.eps, **kwargs)


def _mars(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Variance reduction: MARS-AdamW (Yuan et al. 2024), AdamW on c = g + γ·β1/(1−β1)·(g − g_prev), clipped to unit
    norm, with the previous step's gradient (the paper's MARS-approx); γ = 0.025; decoupled decay."""
    kwargs = {"gamma": 0.025, "mars_type": "adamw", "weight_decouple": True, **cfg.kwargs}
    return po.MARS(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


def _sf_adamw(groups: list[dict], cfg: OptimizerConfig, model: nn.Module) -> torch.optim.Optimizer:
    """Schedule-Free AdamW (Defazio et al. 2024): gradients at y = (1−β1)z + β1x, iterate z, average x weighted by
    lr_max²; no LR decay (the benchmark keeps only the warmup). Validation and checkpoints use x (optimizer.eval())."""
    return po.ScheduleFreeAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **cfg.kwargs)


for _name, _spec in {
    "sgd": OptimizerSpec(_sgd, family="classical"),
    "adafactor": OptimizerSpec(_adafactor, family="memory-efficient"),
    "muon": OptimizerSpec(_muon, matrices_only=True, family="matrix-based"),
    "lion": OptimizerSpec(_lion, family="sign-based", library="pytorch-optimizer"),
    "signum": OptimizerSpec(_signum, family="sign-based", library="pytorch-optimizer"),
    "soap": OptimizerSpec(_soap, matrices_only=True, family="second-order", library="pytorch-optimizer"),
    "sophia": OptimizerSpec(_sophia, family="second-order", library="pytorch-optimizer"),
    "adam_mini": OptimizerSpec(_adam_mini, family="memory-efficient", library="pytorch-optimizer"),
    "galore": OptimizerSpec(_galore, matrices_only=True, family="low-rank", library="pytorch-optimizer"),
    "ademamix": OptimizerSpec(_ademamix, family="adaptive", library="pytorch-optimizer"),
    "mars": OptimizerSpec(_mars, family="variance-reduced", library="pytorch-optimizer"),
    "sf_adamw": OptimizerSpec(_sf_adamw, family="schedule-free", library="pytorch-optimizer", schedule_free=True),
}.items():
    register(_name, _spec)
