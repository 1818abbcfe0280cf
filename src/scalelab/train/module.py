"""The LightningModule: manual optimization over the optimizer list of scalelab.optim.

Manual, because a matrix optimizer comes with an AdamW side-optimizer (scale vectors always get
AdamW-style updates) and Lightning's automatic optimization steps one optimizer per batch. The module counts its own
optimizer steps (`self.step`): Lightning's `global_step` counts every optimizer's step, i.e. twice per batch under
Muon + AdamW, so the step, the LR schedule, the data stream and every logged metric use `self.step` instead.
Family hooks (scalelab.optim.hooks): Sophia gets its Hessian estimate through `step(hessian=...)`;
Schedule-Free optimizers are validated and checkpointed at their averaged weights and train at their iterate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F

from scalelab.config import OptimizerConfig, ScaleConfig, ScheduleConfig
from scalelab.optim import apply_lr, build_optimizers, hooks, lr_factor, own_lrs

from scalelab.train.datamodule import Batch


class LitLM(L.LightningModule):
    """One training step = one global batch (this rank's share), split into `accumulate` micro-batches."""

    def __init__(self, model: torch.nn.Module, *, optimizer: OptimizerConfig, scale: ScaleConfig,
                 schedule: ScheduleConfig, total_steps: int, accumulate: int = 1, grad_clip: float = 0.0,
                 own_lr: Callable[[str], float | None] | None = None) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.model = model
        self.optimizer_cfg, self.scale_cfg, self.schedule = optimizer, scale, schedule
        self.total_steps, self.accumulate, self.grad_clip = total_steps, accumulate, grad_clip
        self.own_lr = own_lr  # parameter name -> its own base LR, None: the optimizer's (scalelab.optim.own_lrs)
        # weight of out.aux_loss inside out.loss (MoE balance; Hidden Decoding's hidden-stream CE): logged apart
        self.aux_coef = (model.aux_loss_coef if hasattr(model, "aux_loss_coef")
                         else model.cfg.moe.aux_loss_coef if model.cfg.moe is not None else 0.0)
        self.step = 0  # optimizer steps completed (restored from checkpoints)
        self.step_metrics: dict[str, float] = {}  # this step's metrics; callbacks add theirs, MetricsFile logs them

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        optimizers = build_optimizers(self.model, self.optimizer_cfg, self.scale_cfg)
        return own_lrs(optimizers, self.model, self.own_lr) if self.own_lr else optimizers

    def training_step(self, batch: Batch, batch_idx: int) -> None:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        hooks.train_weights([o.optimizer for o in opts])  # Schedule-Free: y back in after validation or a resume
        x, y = batch
        loss = aux = torch.zeros((), device=self.device)
        no_sync = getattr(self.trainer.strategy, "block_backward_sync", contextlib.nullcontext)
        for i, (xm, ym) in enumerate(zip(x.chunk(self.accumulate), y.chunk(self.accumulate))):
            # DDP all-reduces gradients on the last micro-batch only; the earlier ones accumulate locally.
            with no_sync() if i < self.accumulate - 1 else contextlib.nullcontext():
                out = self.model(xm, ym)
                self.manual_backward(out.loss / self.accumulate)
            ce = out.loss.detach() - (self.aux_coef * out.aux_loss.detach() if self.aux_coef else 0)  # log CE alone
            loss = loss + ce / self.accumulate
            aux = aux + out.aux_loss.detach() / self.accumulate
        # Mean over ranks, so every rank sees the same (possibly non-finite) loss and NonFiniteGuard acts everywhere.
        loss, aux = self.trainer.strategy.reduce(torch.stack([loss, aux]), reduce_op="mean")
        grad_norm = self._clip_gradients()
        factor = lr_factor(self.schedule, self.step, self.total_steps)
        apply_lr([o.optimizer for o in opts], factor)
        self.step_metrics = {"train/loss": loss.item(), "train/aux_loss": aux.item(),
                             "train/grad_norm": grad_norm.item(), "lr": opts[0].param_groups[0]["lr"]}
        for opt in opts:  # NonFiniteGuard checks step_metrics before the first of these changes any weight
            if hooks.hessian_due(opt.optimizer):  # Sophia: a fresh diagonal Hessian estimate on this step's batch
                opt.step(hessian=self._hessian(opt.optimizer, x.chunk(self.accumulate)[0]))
            else:
                opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        self.step += 1

    def _hessian(self, opt: torch.optim.Optimizer, x: torch.Tensor) -> list[torch.Tensor]:
        """Sophia-G's Gauss-Newton-Bartlett estimate on one micro-batch, averaged over ranks (one estimate for all)."""
        h = hooks.gnb_hessian(self.model, x, hooks.params_of(opt), seed=torch.initial_seed() + self.step)
        return [self.trainer.strategy.reduce(t, reduce_op="mean") for t in h]

    def _raw_optimizers(self) -> list[torch.optim.Optimizer]:
        trainer = getattr(self, "_trainer", None)
        return list(trainer.optimizers) if trainer is not None else []

    def _clip_gradients(self) -> torch.Tensor:
        """Total L2 norm over all parameters (after DDP's all-reduce: identical on every rank); clip if asked."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
        return norm

    @torch.no_grad()
    def evaluate(self, batches: list[Batch]) -> float:
        """Token-weighted mean cross-entropy over `batches`, summed over ranks (each rank passes its share).

        Cross-entropy from the logits, not the model's loss: validation excludes the MoE auxiliary loss.
        """
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # [sum of token losses, tokens]
        with self.trainer.precision_plugin.forward_context(), hooks.eval_weights(self._raw_optimizers()):
            for x, y in batches:
                x, y = x.to(self.device), y.to(self.device)
                logits = self.model(x).logits.float()
                total[0] += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").double()
                total[1] += y.numel()
        self.model.train(was_training)
        total = self.trainer.strategy.reduce(total, reduce_op="sum")
        return (total[0] / total[1]).item()

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["scalelab"] = {"step": self.step}
        opts = self._raw_optimizers()
        if any(hooks.schedule_free(o) for o in opts):
            # Schedule-Free: the checkpoint holds the averaged weights x (what validation scored, what an export
            # should be) and the optimizers in eval mode; training_step swaps y back in, after a resume as here.
            strategy = self.trainer.strategy
            with hooks.eval_weights(opts):
                checkpoint["state_dict"] = {k: v.clone() for k, v in strategy.lightning_module_state_dict().items()}
                if "optimizer_states" in checkpoint:
                    checkpoint["optimizer_states"] = [strategy.optimizer_state(o) for o in opts]

    def on_train_end(self) -> None:
        for opt in self._raw_optimizers():  # Schedule-Free: the final weights (fit's export) are the average x
            if hooks.schedule_free(opt):
                opt.eval()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.step = checkpoint["scalelab"]["step"]
