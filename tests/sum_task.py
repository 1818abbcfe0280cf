"""A second finite-state source for the window-floor tests (scalelab.hidden_decoding.window_floor): unlike the parity
task, its hidden state (a partial sum) is not a function of the last few tokens, so the recursion over beliefs is
tested where it matters. It was the task of a retired probe: blocks `d1 … dK = s` of
K uniform digits 0..base−1, a separator, then their sum s — modulo `mod`, or (mod 0) the plain sum, written with its
own tokens after the separator. Digits are unpredictable (ln base each), the separator and the sum are determined by
what precedes them, so a model that adds K digits in one pass reaches the floor and one that cannot pays the sum's
entropy.

The task is also a finite-state source (`initial`, `emit`), the form scalelab.hidden_decoding.window_floor needs to compute
the exact Bayes loss of windows cut from its stream at any alignment: a state is (position in the block, partial sum).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.data.shards import file_sha256

VOCAB = 16  # digits 0..base−1, the separator `base`, then (plain sums) the sum tokens; the rest unused
SHARD_TOKENS = 400_000  # tokens written for the train shard; the val shard gets a tenth, from another generator

State = tuple[int, int]  # (position in the block 0..K+1, partial sum of the block's digits so far)


@dataclass(frozen=True)
class SumTask:
    """Blocks `d1 … dK = s`; `blind`: the source as a model that ignores the digits when it predicts s sees it (s
    drawn from its marginal), the reference a model that computes no part of the sum reaches."""

    K: int
    base: int = 7
    mod: int = 7
    blind: bool = False

    def __post_init__(self) -> None:
        if self.K < 1 or self.base < 2 or self.mod < 0:
            raise ValueError(f"sum task K={self.K} base={self.base} mod={self.mod}: need K ≥ 1, base ≥ 2, mod ≥ 0")
        if self.base + 1 + (0 if self.mod else self.K * (self.base - 1) + 1) > VOCAB or self.mod > self.base + 1:
            raise ValueError(f"sum task K={self.K} base={self.base} mod={self.mod} needs more than {VOCAB} tokens")

    @property
    def period(self) -> int:
        return self.K + 2

    def describe(self) -> str:
        sum_ = "plain sum" if not self.mod else f"sum modulo {self.mod}"
        return f"{sum_} of {self.K} base-{self.base} digits"

    def sum_probs(self) -> np.ndarray:
        """The distribution of s (the convolution of K uniform digits, folded modulo `mod`)."""
        p = _digit_sums(self.K, self.base)
        return np.bincount(np.arange(len(p)) % self.mod, p) if self.mod else p

    def sum_token(self, s: int) -> int:
        return s % self.mod if self.mod else self.base + 1 + s

    def stationary_floor(self) -> float:
        """Mean loss per token of the optimum on the endless stream: K unpredictable digits per K + 2 tokens. Windows
        cut from the stream cannot reach it (hidden_decoding.window_floor)."""
        return self.K * math.log(self.base) / self.period

    def tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n // (K + 2) whole blocks, the stream starting at a block's first digit."""
        digits = rng.integers(0, self.base, (n // self.period, self.K))
        s = digits.sum(1, keepdims=True)
        s = s % self.mod if self.mod else self.base + 1 + s
        return np.concatenate([digits, np.full((len(digits), 1), self.base), s], axis=1).reshape(-1)

    # ---- the finite-state source
    def initial(self, phase: int) -> dict[State, float]:
        """The state at a window's start `phase` tokens into a block: the digits before it unseen (their sum is
        distributed as that of `phase` digits; all K of them from the separator on)."""
        if not 0 <= phase < self.period:
            raise ValueError(f"phase {phase} outside 0..{self.period - 1}")
        if self.blind:
            return {(phase, 0): 1.0}
        p = _digit_sums(min(phase, self.K), self.base)
        return {(phase, s): float(q) for s, q in enumerate(p) if q > 0}

    def emit(self, state: State) -> list[tuple[int, float, State]]:
        """(token, probability, next state) for every token the state can emit."""
        j, s = state
        if j < self.K:
            return [(d, 1 / self.base, (j + 1, 0 if self.blind else s + d)) for d in range(self.base)]
        if j == self.K:
            return [(self.base, 1.0, (self.K + 1, s))]
        if self.blind:
            return [(self.sum_token(v), float(q), (0, 0)) for v, q in enumerate(self.sum_probs()) if q > 0]
        return [(self.sum_token(s), 1.0, (0, 0))]


def _digit_sums(k: int, base: int) -> np.ndarray:
    p = np.ones(1)
    for _ in range(k):
        p = np.convolve(p, np.full(base, 1 / base))
    return p


def write_task(folder: Path, task: SumTask, tokens: int = SHARD_TOKENS, seed: int = 0) -> None:
    """Token shards of the task in the loader's format: train (`tokens`, generator `seed`) and val (a tenth, generator
    `seed` + 1), each starting at a block's first digit."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"sum-k{task.K}-base{task.base}-mod{task.mod}"
    meta = {"dtype": "uint16", "vocab_size": VOCAB, "eot_id": task.base, "tokenizer_sha256": name, "shards": {}}
    for split, n, s in (("train", tokens, seed), ("val", tokens // 10, seed + 1)):
        path = folder / f"{split}.bin"
        task.tokens(np.random.default_rng(s), n).astype(np.uint16).tofile(path)
        meta["shards"][split] = {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (folder / "meta.json").write_text(json.dumps(meta))


def shard_lengths(task: SumTask, tokens: int = SHARD_TOKENS) -> tuple[int, int]:
    """(train, val) shard lengths in tokens that `write_task` writes: whole blocks only."""
    return tokens // task.period * task.period, tokens // 10 // task.period * task.period


@dataclass(frozen=True)
class Floors:
    """The validation windows' references: `floor` (the Bayes loss of the trained predictor), `sum_blind` (the same
    for a predictor that ignores the digits when it predicts the sum) and the stationary floor beside them."""

    floor: float
    sum_blind: float
    stationary: float


def sum_task_floors(task: SumTask, seq_len: int, val_tokens: int) -> Floors:
    """The floors of the sum task's validation windows as `write_task` writes its shards and the loader cuts them."""
    from scalelab.hidden_decoding import window_floor as wf

    n_train, n_val = shard_lengths(task)
    windows = wf.val_phases(n_val, seq_len, val_tokens, task.period)
    prior = wf.train_phases(n_train, seq_len, task.period)
    blind = SumTask(task.K, task.base, task.mod, blind=True)
    return Floors(floor=wf.window_loss(task, task, windows, prior, seq_len),
                  sum_blind=wf.window_loss(task, blind, windows, prior, seq_len), stationary=task.stationary_floor())
