"""Whether a tuned hyperparameter's choice is interior: the premise every tuned arm of every paper's study states
before its claims are read (a claim whose arm was tuned at the edge of the values tried may only have run out of
grid).

The rule, with a noise tolerance: the best value (lowest loss) is interior when it has a tried neighbour on both
sides; at an end of the values tried it is still interior when

- the end is a natural bound of the hyperparameter (a weight decay or a warmup of 0, a momentum of 1): nothing lies
  past it to try, or
- it beats its one neighbour by less than `tolerance`, the seed spread of that loss (the held-out seeds' standard
  deviation at the same setting): the edge and its neighbour are the same within noise, so the choice between them
  does not steer the claim.

An edge that beats its neighbour by more than the noise is at the edge: the grid should have been extended.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def edge(scores: Mapping[float, float], tolerance: float, bounds: tuple[float, ...] = ()) -> str | None:
    """None where the best of `scores` (value tried -> loss; non-finite: diverged) is interior by the rule above;
    else why not, in words. `bounds`: the hyperparameter's natural bounds."""
    finite = {v: s for v, s in scores.items() if math.isfinite(s)}
    if not finite:
        return "nothing trained"
    values = sorted(scores)
    best = min(finite, key=finite.get)
    i = values.index(best)
    if 0 < i < len(values) - 1 or len(values) == 1 and best in bounds:
        return None
    if len(values) == 1:
        return f"{best:g} is the only value tried"
    if best in bounds:
        return None
    neighbour = values[1] if i == 0 else values[-2]
    margin = scores[neighbour] - finite[best] if math.isfinite(scores[neighbour]) else math.inf
    if margin < tolerance:
        return None
    side = "smallest" if i == 0 else "largest"
    return (f"{best:g}, the {side} tried, beats its neighbour {neighbour:g} by {margin:.4f}, more than the seed "
            f"spread {tolerance:.4f}")
