"""The gated start of Hidden Decoding: the last stream reads the hidden streams through a gate that starts at 0, so an
n-stream model at step 0 computes its backbone's function exactly.

Why: with the hidden streams read from the first step, n > 1 starts from a perturbed function (a hidden stream sees
its own token fewer times than the earlier ones in a mixing layer, drifts, and feeds the drift forward), and a short
continued pretraining measures the recovery from that start, not what the streams add. Under the gate, in every
mixing layer ℓ the attention output of the last stream's query (i, n) is

    o(i,n) = o_own(i,n) + α_ℓ · (o_mix(i,n) − o_own(i,n))

o_mix the mixing attention over every visible entry (the method's rule), o_own the same query's causal attention
over stream n alone (what the backbone's layer computes), α_ℓ a learned scalar per mixing layer, 0 at init. With
α = 0 stream n never reads streams 1..n−1, so with token positions in the mixing layers (positions `shared`) it is the
backbone's forward; the gradient of α is not zero there, so training opens the gate. The hidden streams' own queries
read every entry, as without the gate. Cost: one causal attention over T entries per mixing layer, beside the
mixing one over n·T.

The backbone's attention modules call `attention` (registered with transformers as ATTENTION), which a gated
mixing layer's call reaches with the keyword `hd_gate=(n, α)`; every other call is plain SDPA.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "scalelab_hd_gate"


def attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask,
              dropout: float = 0.0, scaling: float | None = None, hd_gate: tuple[int, torch.Tensor] | None = None,
              **kwargs):
    """transformers' attention-function signature; query [B, H, N, D], key and value [B, Hkv, Nk, D], token-major
    (entry n·i + s) in a mixing layer. Returns ([B, N, H, D], None)."""
    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
    if hd_gate is None:
        return out, None
    n, alpha = hd_gate
    last = slice(n - 1, None, n)  # stream n's entries, queries and keys alike
    mask = None if attention_mask is None else attention_mask[..., last, last]
    own, _ = sdpa_attention_forward(module, query[:, :, last], key[:, :, last], value[:, :, last], mask,
                                    dropout=dropout, scaling=scaling, **kwargs)
    B, N, H, D = out.shape
    out = out.view(B, N // n, n, H, D)
    gated = own + alpha.to(own.dtype) * (out[:, :, -1] - own)
    return torch.cat([out[:, :, :-1], gated[:, :, None]], dim=2).view(B, N, H, D), None


AttentionInterface.register(ATTENTION, attention)
