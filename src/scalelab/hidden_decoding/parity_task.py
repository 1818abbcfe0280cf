"""A synthetic task that needs width, not depth: K-bit parity answered as one token.

A block is `b1 … bK | P … P a`: K uniform bits, a separator, `pauses` pause tokens, then the answer `a`, the parity
of the K bits written as its own token (EVEN or ODD). Every token but the bits is determined by what precedes it, so
the exact floor of the answer token is 0 and a model that computes no part of the parity pays ln 2 on it (the blind
reference). Parity of K bits has no correlation with any fewer of them, so a shallow model gets no partial signal to
start learning it from, and the harder the larger K; extra positions at the answer that each read every bit are known
to help (pause tokens; London & Kanade, arXiv 2505.21024, show two-layer causal transformers learning parity with them
and not without): the `pauses` variant is the positive control of a probe that asks whether hidden streams do the
same.

Every window is whole blocks: the streams start at a block's first bit, the training windows are drawn at block
boundaries (`train_batch`) and the loader cuts the validation windows at multiples of seq_len (`seq_len`: a whole
number of blocks), so every answer in a window follows all K of its bits and its loss is read against floor 0
(scalelab.hidden_decoding.window_floor's phase count of the loader's windows checks it in the tests). The task is also a
finite-state source (`initial`, `emit`), the form scalelab.hidden_decoding.window_floor computes exact floors from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

SEP, PAUSE, EVEN, ODD, AT_LEAST, BELOW = 2, 3, 4, 5, 6, 7  # bits are 0 and 1; the last two are hint targets
VOCAB = 8
SHARD_TOKENS = 1_000_000  # train stream; the val stream gets a tenth, from another generator

State = tuple[int, int]  # (position in the block 0..period−1, parity of the block's bits so far)


@dataclass(frozen=True)
class ParityTask:
    """Blocks of K bits, a separator, `pauses` pause tokens and the parity. `blind`: the source as a model that
    ignores the bits when it predicts the answer sees it (the answer uniform), the ln 2 reference. `hints`: the
    pauses' threshold targets (`targets`); the token stream, and so the finite-state source, is the same."""

    K: int
    pauses: int = 0
    blind: bool = False
    hints: bool = False

    def __post_init__(self) -> None:
        if self.K < 1 or self.pauses < 0:
            raise ValueError(f"parity task K={self.K} pauses={self.pauses}: need K ≥ 1 and pauses ≥ 0")
        if self.hints and self.pauses < 2:
            raise ValueError(f"parity task hints with pauses={self.pauses}: hints are the targets of every pause but "
                             "the last (which predicts the answer), so they need pauses ≥ 2")

    @property
    def period(self) -> int:
        return self.K + 2 + self.pauses

    @property
    def answer_offset(self) -> int:
        """Index of the answer token inside a block."""
        return self.period - 1

    def describe(self) -> str:
        extra = f", {self.pauses} pause tokens before the answer" if self.pauses else ""
        return f"parity of {self.K} bits{extra}{' (threshold hints)' if self.hints else ''}"

    def seq_len(self, blocks: int) -> int:
        """The window length holding `blocks` whole blocks: windows cut at its multiples start at a block boundary."""
        return blocks * self.period

    def tokens(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n // period whole blocks, the stream starting at a block's first bit."""
        bits = rng.integers(0, 2, (n // self.period, self.K))
        answer = np.where(bits.sum(1, keepdims=True) % 2 == 1, ODD, EVEN)
        fill = np.full((len(bits), 1 + self.pauses), PAUSE)
        fill[:, 0] = SEP
        return np.concatenate([bits, fill, answer], axis=1).reshape(-1)

    def targets(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training targets of windows (x, y) of whole blocks starting at a block's first bit: y itself, or with
        `hints` y where pause j < P of each block (its target the next pause) is AT_LEAST if the block's count of
        set bits c satisfies c·P ≥ j·K, else BELOW."""
        if not self.hints:
            return y
        B, T = x.shape
        if T % self.period:
            raise ValueError(f"{self.describe()}: windows of {T} tokens are not whole {self.period}-token blocks")
        blocks = x.reshape(B, T // self.period, self.period)
        count = blocks[..., :self.K].sum(-1, keepdim=True)  # (B, blocks, 1)
        j = torch.arange(1, self.pauses, device=x.device)
        hint = torch.where(count * self.pauses >= j * self.K, AT_LEAST, BELOW)
        out = y.clone().reshape(B, T // self.period, self.period)
        out[..., self.K + 1:self.K + self.pauses] = hint  # pause j sits at K + j; it predicts what follows it
        return out.reshape(B, T)

    def answer_targets(self, y: np.ndarray) -> np.ndarray:
        """Boolean mask of the answer tokens among targets `y` (a target is an answer iff it is EVEN or ODD)."""
        return (y == EVEN) | (y == ODD)

    # ---- the finite-state source
    def initial(self, phase: int) -> dict[State, float]:
        """The state `phase` tokens into a block; the parity of bits before the window is unseen (uniform once any
        bit is unseen)."""
        if not 0 <= phase < self.period:
            raise ValueError(f"phase {phase} outside 0..{self.period - 1}")
        if phase == 0 or self.blind:
            return {(phase, 0): 1.0}
        return {(phase, 0): 0.5, (phase, 1): 0.5}

    def emit(self, state: State) -> list[tuple[int, float, State]]:
        """(token, probability, next state) for every token the state can emit."""
        j, p = state
        if j < self.K:
            return [(b, 0.5, (j + 1, 0 if self.blind else p ^ b)) for b in (0, 1)]
        if j < self.answer_offset:
            return [(SEP if j == self.K else PAUSE, 1.0, (j + 1, p))]
        if self.blind:
            return [(EVEN, 0.5, (0, 0)), (ODD, 0.5, (0, 0))]
        return [(ODD if p else EVEN, 1.0, (0, 0))]


    # ---- the streams and windows the cells train and validate on
    def streams(self, tokens: int = SHARD_TOKENS, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """(train, val) token streams: `tokens` of train (generator `seed`) and a tenth of val (generator
        `seed` + 1), whole blocks, each starting at a block's first bit."""
        return tuple(self.tokens(np.random.default_rng(s), n).astype(np.uint16)
                     for n, s in ((tokens, seed), (tokens // 10, seed + 1)))

    def train_batch(self, tokens: np.ndarray, *, seed: int, step: int, batch_size: int, seq_len: int,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """Rank `rank`'s rows (r::world_size) of step `step`'s batch of `batch_size` windows of seq_len tokens drawn
        at block boundaries, a pure function of (seed, step) as the loader's `train_batch` (x = tokens[s : s+T],
        y = tokens[s+1 : s+T+1])."""
        if seq_len % self.period:
            raise ValueError(f"{self.describe()}: seq_len {seq_len} is not a whole number of {self.period}-token blocks")
        starts = np.random.Generator(np.random.PCG64([seed, step])).integers(
            0, (len(tokens) - seq_len - 1) // self.period + 1, size=batch_size) * self.period
        buf = torch.from_numpy(tokens[starts[rank::world_size, None] + np.arange(seq_len + 1)].astype(np.int64))
        return buf[:, :-1], buf[:, 1:]


BLIND_LOSS = math.log(2)  # the answer token's loss for a model that computes no part of the parity
