"""The parity probe's side of a Hidden Decoding cell (`train.corpus: parity`): the cell's task, its streams built in
memory, its training windows drawn at block boundaries, and the answer token's loss and accuracy on the validation
windows, which the loader cuts at block boundaries too (seq_len is a whole number of blocks).

A window holding part of a block would ask for the parity of bits it cannot see; on whole blocks the answer's floor
is 0 and a model blind to the bits pays ln 2 (scalelab.hidden_decoding.parity_task), so the answer metrics read how much of the
parity a cell computes, which the mean loss over every token (the random bits dominate it) hides.
"""

from __future__ import annotations

import hashlib

from torch.utils.data import DataLoader

from scalelab.config import HDTrainConfig, HiddenDecodingConfig
from scalelab.data.loader import Shards, val_batches
from scalelab.hidden_decoding.parity_task import SEP, VOCAB, ParityTask
from scalelab.hidden_decoding.answers import scored_targets
from scalelab.train.datamodule import StepBatches, TokenDataModule

ANSWER_BATCH = 64  # windows per forward pass when scoring the answers


def task_of(hd: HiddenDecodingConfig, cell: str) -> ParityTask | None:
    """The cell's parity task (its `bits`, `pauses` and `hints`), or None off the parity corpus."""
    c = hd.cells[cell]
    return ParityTask(c.bits, c.pauses, hints=c.hints) if hd.train.corpus == "parity" else None


def cell_train(hd: HiddenDecodingConfig, cell: str) -> HDTrainConfig:
    """The cell's train section: on the parity corpus its windows are `parity.blocks` whole blocks of its task and
    its validation `parity.val_windows` of them; elsewhere the section's."""
    task = task_of(hd, cell)
    if task is None:
        return hd.train
    seq_len = task.seq_len(hd.train.parity.blocks)
    return hd.train.model_copy(update={"seq_len": seq_len, "val_tokens": seq_len * hd.train.parity.val_windows})


def task_shards(hd: HiddenDecodingConfig, cell: str) -> tuple[Shards, str]:
    """The cell's task streams (scalelab.hidden_decoding.parity_task, generators 0 and 1) and their identity for the config
    hash."""
    task = task_of(hd, cell)
    train, val = task.streams(hd.train.parity.tokens)
    digest = hashlib.sha256(f"{task}|{hd.train.parity.tokens}".encode()).hexdigest()
    return Shards(train=train, val=val, vocab_size=VOCAB, eot_id=SEP,
                  meta={"source": task.describe(), "tokens": [len(train), len(val)]}), digest


class BlockBatches(StepBatches):
    """The task's training windows of each step, drawn at block boundaries (ParityTask.train_batch)."""

    def __init__(self, task: ParityTask, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.task = task

    def __iter__(self):
        for step in range(self.start, self.total):
            x, y = self.task.train_batch(self.shards.train, seed=self.seed, step=step, batch_size=self.cfg.batch_size,
                                         seq_len=self.cfg.seq_len, rank=self.rank, world_size=self.world_size)
            yield x, self.task.targets(x, y)


class BlockDataModule(TokenDataModule):
    """TokenDataModule whose training stream is the task's BlockBatches (validation: the loader's windows), both
    with the task's targets."""

    def __init__(self, task: ParityTask, shards: Shards, cfg, seed: int) -> None:
        super().__init__(shards, cfg, seed)
        self.task = task
        self._val = [(x, task.targets(x, y)) for x, y in self._val]

    def train_dataloader(self) -> DataLoader:
        stream = BlockBatches(self.task, self.shards, self.cfg, seed=self.seed,
                              start=self.trainer.lightning_module.step, total=self.cfg.total_steps(),
                              rank=self.trainer.global_rank, world_size=self.trainer.world_size)
        return DataLoader(stream, batch_size=None)


def answer_metrics(model, task: ParityTask, shards: Shards, tc: HDTrainConfig) -> dict:
    """The answer token's loss and accuracy over the cell's validation windows, with the task that defines them."""
    batches = val_batches(shards.val, seq_len=tc.seq_len, val_tokens=tc.val_tokens, batch_size=ANSWER_BATCH)
    return {"bits": task.K, "pauses": task.pauses, "hints": task.hints, "seq_len": tc.seq_len,
            **scored_targets(model, batches, task.answer_targets)}
