"""Token batches for Lightning: a step-indexed training stream and the fixed validation windows.

The global batch of step s is a pure function of (seed, s) (scalelab.data.loader), so the stream needs no state of
its own: it starts at the module's restored step, and a resumed run continues with exactly the batches an
uninterrupted run would have seen, neither replaying nor skipping any (Lightning's prefetch reads one batch ahead of
the step being trained, which is harmless for a pure function).
"""

from __future__ import annotations

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from scalelab.config import PretrainConfig
from scalelab.data.loader import Shards, train_batch, val_batches

Batch = tuple[torch.Tensor, torch.Tensor]


class StepBatches(IterableDataset):
    """This rank's rows of the global batches of steps start..total-1 (one item per optimizer step)."""

    def __init__(self, shards: Shards, cfg: PretrainConfig, *, seed: int, start: int, total: int, rank: int,
                 world_size: int) -> None:
        self.shards, self.cfg, self.seed = shards, cfg, seed
        self.start, self.total, self.rank, self.world_size = start, total, rank, world_size

    def __iter__(self):
        for step in range(self.start, self.total):
            yield train_batch(self.shards.train, seed=self.seed, step=step, batch_size=self.cfg.batch_size,
                              seq_len=self.cfg.seq_len, rank=self.rank, world_size=self.world_size)


class TokenDataModule(L.LightningDataModule):
    """Training stream from `train_batch(seed, step)`; validation = the fixed `val_batches` list.

    `pretrain.batch_size` is the global batch: DDP rank r gets rows r::world_size of it, and the module splits that
    share into `accumulate` micro-batches.
    """

    def __init__(self, shards: Shards, cfg: PretrainConfig, seed: int) -> None:
        super().__init__()
        self.shards, self.cfg, self.seed = shards, cfg, seed
        self._val = val_batches(shards.val, seq_len=cfg.seq_len, val_tokens=cfg.val_tokens,
                                batch_size=cfg.batch_size // (cfg.accumulate * cfg.devices * cfg.num_nodes))  # a micro-batch

    def train_dataloader(self) -> DataLoader:
        # Called after Lightning restored the checkpoint, so the module's step is the first step still to train.
        start = self.trainer.lightning_module.step
        stream = StepBatches(self.shards, self.cfg, seed=self.seed, start=start, total=self.cfg.total_steps(),
                             rank=self.trainer.global_rank, world_size=self.trainer.world_size)
        return DataLoader(stream, batch_size=None)  # items are already batches

    def val_share(self) -> list[Batch]:
        """This rank's share of the fixed validation batches (their losses are summed over ranks)."""
        return self._val[self.trainer.global_rank :: self.trainer.world_size]

    def sharpness_batch(self, batch_size: int) -> Batch:
        """A fixed batch of training windows (the same on every rank and every call)."""
        return train_batch(self.shards.train, seed=self.seed, step=0, batch_size=batch_size,
                           seq_len=self.cfg.seq_len)
