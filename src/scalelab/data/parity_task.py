"""A synthetic task that needs width, not depth: K-bit parity answered as one token.

A block is `b1 … bK | P … P a`: K uniform bits, a separator, `pauses` pause tokens, then the answer `a`, the parity
of the K bits written as its own token (EVEN or ODD). Every token but the bits is determined by what precedes it, so
the exact floor of the answer token is 0 and a model that computes no part of the parity pays ln 2 on it (the blind
reference). Parity of K bits has no correlation with any fewer of them, so a shallow model gets no partial signal to
start learning it from, and the harder the larger K; extra positions at the answer that each read every bit are known
to help (pause tokens; London & Kanade, arXiv 2505.21024, show two-layer causal transformers learning parity with them
and not without): the `pauses` variant is the positive control of a probe that asks whether hidden streams do the
same.

The loss is read on the answer tokens of windows aligned to the blocks: the validation windows start at multiples of
seq_len from a stream that starts at a block's first bit, so with seq_len a whole number of blocks (`seq_len`) each
window starts at a block boundary and every answer in it follows all K of its bits (scalelab.analysis.hd_parity
checks it with the window-floor machinery's own phase count). The task is also a finite-state source (`initial`,
`emit`), the form scalelab.analysis.window_floor computes exact floors from.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scalelab.data.shards import file_sha256

SEP, PAUSE, EVEN, ODD = 2, 3, 4, 5  # bits are 0 and 1
VOCAB = 8  # the six tokens above, rounded up
SHARD_TOKENS = 1_000_000  # train shard; the val shard gets a tenth, from another generator

State = tuple[int, int]  # (position in the block 0..period−1, parity of the block's bits so far)


@dataclass(frozen=True)
class ParityTask:
    """Blocks of K bits, a separator, `pauses` pause tokens and the parity. `blind`: the source as a model that
    ignores the bits when it predicts the answer sees it (the answer uniform), the ln 2 reference."""

    K: int
    pauses: int = 0
    blind: bool = False

    def __post_init__(self) -> None:
        if self.K < 1 or self.pauses < 0:
            raise ValueError(f"parity task K={self.K} pauses={self.pauses}: need K ≥ 1 and pauses ≥ 0")

    @property
    def period(self) -> int:
        return self.K + 2 + self.pauses

    @property
    def answer_offset(self) -> int:
        """Index of the answer token inside a block."""
        return self.period - 1

    def describe(self) -> str:
        extra = f", {self.pauses} pause tokens before the answer" if self.pauses else ""
        return f"parity of {self.K} bits{extra}"

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


BLIND_LOSS = math.log(2)  # the answer token's loss for a model that computes no part of the parity


def write_task(folder: Path, task: ParityTask, tokens: int = SHARD_TOKENS, seed: int = 0) -> None:
    """Token shards of the task in the loader's format: train (`tokens`, generator `seed`) and val (a tenth,
    generator `seed` + 1), each starting at a block's first bit."""
    folder.mkdir(parents=True, exist_ok=True)
    name = f"parity-k{task.K}-pauses{task.pauses}"
    meta = {"dtype": "uint16", "vocab_size": VOCAB, "eot_id": SEP, "tokenizer_sha256": name, "shards": {}}
    for split, n, s in (("train", tokens, seed), ("val", tokens // 10, seed + 1)):
        path = folder / f"{split}.bin"
        task.tokens(np.random.default_rng(s), n).astype(np.uint16).tofile(path)
        meta["shards"][split] = {"file": path.name, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
    (folder / "meta.json").write_text(json.dumps(meta))
