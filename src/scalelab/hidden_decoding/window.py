"""The local cross-stream layer of Hidden Decoding (beyond the sources): attention over a window of tokens, all
their streams, in token-major order (entry n·i + s), without a mask over the whole sequence.

    (i,s) attends (j,s') for i − w < j < i, and (i,s') for s' ≤ s        (w = local_window; w ≥ T: a mixing layer)

In token-major order that is "every earlier entry, back to the first stream of token i − w + 1". Cut the sequence
into blocks of b = n·w entries (w whole tokens): the entries a query of block j may read lie in blocks j − 1 and j,
so each block attends [previous block; own block] (2b keys) under one [b, 2b] mask shared by every block. Memory and
time are O(n·T · 2b) instead of the (nT)² of a masked full attention.

The backbone's attention modules call `attention` (registered with transformers as ATTENTION) with the extra keyword
`hd_window=(n, w)` that `HiddenDecodingLM.run_layers` passes to a local layer's full-sequence forward; every other
call (within-stream and mixing layers, cached decoding under an explicit mask) is plain SDPA, unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTENTION = "scalelab_hd"


def window_mask(n: int, w: int, device=None) -> torch.Tensor:
    """[2, b, 2b] (True = may attend), b = n·w: row a of a block (token a // n of the block) against the previous
    block's and its own entries; [0] is the first block's (it has no previous block), [1] every later one's."""
    b = n * w
    a, c = torch.arange(b, device=device)[:, None], torch.arange(2 * b, device=device)[None, :]
    later = (c <= a + b) & (c >= n * (a // n + 1))  # not after the query; not before token i − w + 1's first stream
    return torch.stack([later & (c >= b), later])


def windowed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int, w: int,
                  scale: float | None = None) -> torch.Tensor:
    """q [B, H, N, D], k and v [B, Hkv, N, D] (N = n·T, token-major) → [B, H, N, D] under the local window rule."""
    B, H, N, D = q.shape
    if k.shape[1] != H:  # grouped key/value heads: each serves H / Hkv query heads
        k, v = (x.repeat_interleave(H // k.shape[1], dim=1) for x in (k, v))
    b = n * w
    blocks = -(-N // b)
    tail = blocks * b - N
    q = F.pad(q, (0, 0, 0, tail)).view(B, H, blocks, b, D)
    # keys padded by one empty block in front (block 0's "previous"), then [previous; own] per block
    k, v = (F.pad(x, (0, 0, b, tail)) for x in (k, v))
    k, v = (torch.cat([x[:, :, :-b].view(B, H, blocks, b, D), x[:, :, b:].view(B, H, blocks, b, D)], dim=3)
            for x in (k, v))
    masks = window_mask(n, w, q.device)
    mask = torch.cat([masks[:1], masks[1:].expand(blocks - 1, -1, -1)])  # [blocks, b, 2b]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.reshape(B, H, blocks * b, D)[:, :, :N]


def attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              hd_window: tuple[int, int] | None = None, **kwargs):
    """transformers' attention-function signature: the windowed path for a local layer's full-sequence forward,
    SDPA (with its causal-when-no-mask semantics) for everything else."""
    if hd_window is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if dropout:
        raise ValueError("Hidden Decoding local layers: attention dropout is not supported")
    out = windowed_sdpa(query, key, value, *hd_window, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION, attention)
