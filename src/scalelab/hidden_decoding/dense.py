"""The dense reference of a Hidden Decoding forward: the test oracle and the benchmark's baseline, never
used by the model.

Stream-major layout throughout, h [B, n, T, d]; a mixing layer runs the n·T entries as one sequence under an explicit
boolean (nT)² mask built from each entry's token and stream index, which is the mixing rule written out
literally. SDPA then computes every score and (transformers turns `enable_gqa` off under a mask) expands the key and
value heads, which is what the token-major model (scalelab.hidden_decoding.model) avoids.
"""

from __future__ import annotations

import torch


def mixing_mask(q_tok: torch.Tensor, q_str: torch.Tensor, k_tok: torch.Tensor, k_str: torch.Tensor,
                window: int | None = None) -> torch.Tensor:
    """The mixing-layer mask [queries, keys] (True = may attend) from each entry's token and stream index:
    (i,s) attends every (j,s') with j < i, and (i,s') with s' ≤ s; with a `window` (a local layer) only j > i − w."""
    i, s = q_tok[:, None], q_str[:, None]
    j, t = k_tok[None, :], k_str[None, :]
    allowed = (j < i) | ((j == i) & (t <= s))
    return allowed & (j > i - window) if window is not None else allowed


def dense_run_layers(model, h: torch.Tensor) -> torch.Tensor:
    """`model.run_layers(h)` (no cache) computed the dense way: stream-major mixing (and local) layers under
    `mixing_mask`."""
    B, n, T, d = h.shape
    tok = torch.arange(T, device=h.device)
    q_tok, q_str = tok.repeat(n), torch.arange(n, device=h.device).repeat_interleave(T)  # stream-major entries
    masks = {"mixing": mixing_mask(q_tok, q_str, q_tok, q_str)[None, None],
             "local": mixing_mask(q_tok, q_str, q_tok, q_str, model.cfg.local_window)[None, None]}
    for i, layer in enumerate(model.backbone.model.layers):
        kind = model.layer_kind(i)
        cos, sin = model.backbone.model.rotary_emb(h, model.positions(tok, kind))  # [n, T, head_dim]
        if kind != "within":
            h = layer(h.reshape(B, n * T, d), attention_mask=masks[kind],
                      position_embeddings=(cos.reshape(1, n * T, -1), sin.reshape(1, n * T, -1)))
        else:
            h = layer(h.reshape(B * n, T, d), attention_mask=None,
                      position_embeddings=(cos.repeat(B, 1, 1), sin.repeat(B, 1, 1)))
        h = h.view(B, n, T, d)
    return h
