"""The exact Bayes loss of validation windows cut from a finite-state source (the parity task,
scalelab.hidden_decoding.parity_task, is one): the floor a trained model's validation loss is measured against.

A model sees each window alone. The validation windows start at multiples of seq_len (scalelab.data.loader
`val_batches`), so unless seq_len is a multiple of the block length, a window starts inside a block: its first
tokens cannot know where the block's boundary falls, and the first answer depends on tokens before the window. The
stationary floor (the entropy per block) ignores both; the floor here does not.

Which predictor: the Bayes predictor of the *training* windows, which start anywhere in the stream (uniform over
`train_batch`'s start range), so its prior over the phase (the offset into a block) is that range's; evaluated on
the validation windows, whose phases follow from their fixed starts. That is the lowest expected loss a model
trained on the task can reach. (A predictor told the validation windows' phases could do better; none is trained
so.)

The expectation is exact: a forward recursion over (true state, predictor's posterior over states) pairs, whose
number stays small because the posterior collapses once a block's boundary has been seen. At step t the predictor's
next-token distribution is p(x | x_<t) = Σ_z b(z) q(x | z) (the filter of a hidden Markov source); the loss is
−ln p(x_t | x_<t), averaged over the window's seq_len targets x_1..x_T and over the windows.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol

State = tuple


class Source(Protocol):
    period: int

    def initial(self, phase: int) -> dict[State, float]: ...

    def emit(self, state: State) -> list[tuple[int, float, State]]: ...


def _mixture(source: Source, phases: Mapping[int, float]) -> dict[State, float]:
    total = sum(phases.values())
    out: dict[State, float] = defaultdict(float)
    for phase, w in phases.items():
        for z, q in source.initial(phase).items():
            out[z] += w / total * q
    return dict(out)


def _predict(source: Source, belief: Mapping[State, float]) -> tuple[dict[int, float], dict[int, dict[State, float]]]:
    """The predictive next-token distribution of `belief` and, for each token, the posterior over next states."""
    pred: dict[int, float] = defaultdict(float)
    post: dict[int, dict[State, float]] = defaultdict(lambda: defaultdict(float))
    for z, w in belief.items():
        for tok, p, nxt in source.emit(z):
            pred[tok] += w * p
            post[tok][nxt] += w * p
    return pred, {t: {z: v / pred[t] for z, v in d.items()} for t, d in post.items()}


def _key(belief: Mapping[State, float]) -> tuple:
    return tuple(sorted((z, round(w, 12)) for z, w in belief.items() if w > 1e-15))


def expected_window_loss(truth: Source, phase: int, model: Source, prior: Mapping[int, float], seq_len: int) -> float:
    """E[mean over t = 1..seq_len of −ln p_model(x_t | x_<t)] for a window of seq_len + 1 tokens starting `phase`
    tokens into a block of `truth`, the predictor being the Bayes filter of `model` with phase prior `prior`."""
    start = _key(_mixture(model, prior))
    pairs: dict[tuple, float] = defaultdict(float)  # (true state, predictor's belief) -> probability
    for z, q in truth.initial(phase).items():
        pairs[(z, start)] += q
    total, cache = 0.0, {}
    for t in range(seq_len + 1):
        nxt: dict[tuple, float] = defaultdict(float)
        for (z, key), q in pairs.items():
            if key not in cache:
                cache[key] = _predict(model, dict(key))
            pred, post = cache[key]
            for tok, p, z2 in truth.emit(z):
                if t > 0:  # x_0 is context only
                    if pred.get(tok, 0.0) <= 0:
                        raise ValueError(f"the model source gives token {tok} probability 0 where the truth emits it")
                    total += q * p * -math.log(pred[tok])
                nxt[(z2, _key(post[tok]))] += q * p
        pairs = nxt
    return total / seq_len


def window_losses(model: Source, prior: Mapping[int, float], window: Sequence[int]) -> list[float]:
    """−ln p(x_t | x_<t) of the Bayes filter of `model` for t = 1..len(window) − 1 of one observed window (the
    realized loss, for checking the expectation against sampled windows)."""
    belief, out = _mixture(model, prior), []
    for t, tok in enumerate(window):
        pred, post = _predict(model, belief)
        if t > 0:
            out.append(-math.log(pred[tok]) if pred.get(tok, 0.0) > 0 else math.inf)
        if tok not in post:
            raise ValueError(f"token {tok} at position {t} cannot follow the window so far under the model source")
        belief = post[tok]
    return out


def val_phases(n_val: int, seq_len: int, val_tokens: int, period: int) -> Counter:
    """Phase → number of validation windows (loader `val_batches`: min(val_tokens, n_val − 1) // seq_len windows
    starting at multiples of seq_len, the stream starting at a block's start)."""
    n_windows = min(val_tokens, n_val - 1) // seq_len
    if n_windows == 0:
        raise ValueError(f"val shard of {n_val} tokens holds no window of seq_len {seq_len}")
    return Counter(w * seq_len % period for w in range(n_windows))


def train_phases(n_train: int, seq_len: int, period: int) -> Counter:
    """Phase → number of training window starts (loader `train_batch`: uniform over 0..n_train − seq_len − 1)."""
    n = n_train - seq_len
    if n <= 0:
        raise ValueError(f"train shard of {n_train} tokens holds no window of seq_len {seq_len}")
    return Counter({p: (n - p + period - 1) // period for p in range(min(period, n))})


def window_loss(truth: Source, model: Source, windows: Mapping[int, int], prior: Mapping[int, float],
                seq_len: int) -> float:
    """The token-weighted mean expected loss over windows (phase → count), every window holding seq_len targets."""
    n = sum(windows.values())
    return sum(c * expected_window_loss(truth, p, model, prior, seq_len) for p, c in windows.items()) / n
