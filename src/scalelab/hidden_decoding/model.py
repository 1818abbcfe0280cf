"""Hidden Decoding (docs/hidden-decoding.md): n embedding streams through an unchanged Hugging Face Llama/Qwen3
backbone, with Stream-Factorized Attention (SFA).

    token i  → n positions (i,1)..(i,n); position (i,s) is token i embedded by table E_s (E_1 is the backbone's own)
    within-stream layer:  stream-major [B·n, T, d], causal SDPA      (i,s) attends (j,s), j ≤ i (cost linear in n)
    mixing layer:         token-major  [B, n·T, d], causal SDPA      (i,s) attends (j,s') for j < i, and (i,s') for
                          s' ≤ s: in token-major order (entry n·i + s) that rule is exactly "every earlier entry", so
                          the layer is plain causal attention over n·T entries (no mask tensor, GQA kept by SDPA,
                          flash-capable on GPU)
    local layer:          token-major  [B, n·T, d], windowed SDPA    as mixing, but only the last `local_window`
                          tokens (scalelab.hidden_decoding.window: blocks of whole tokens, no (nT)² mask)
    logits and loss only at (i,n), which predicts token i+1; (i,1..n-1) are hidden computation.
    RoPE position of (i,s), by layer kind (config POSITIONS): i, or n·i + s (s from 0); "per_layer" (the default,
    WeLM-HD's public description) uses i in within-stream layers and n·i + s in mixing layers.

The residual stream is kept in the layout of the layer being run and transposed (one O(n·T·d) copy) only where
the layer kind changes, so each layer reads a free view. The decoder layers are the backbone's own modules, called
one by one (no copy of their math) under their SDPA attention: `attention_mask=None` makes SDPA causal
(`is_causal`); after cached tokens a boolean offset-causal mask of the new entries against the cache goes to SDPA
as is. With n = 1 every layer runs the within-stream path, which is exactly the backbone's own forward: n = 1
computes the backbone's logits bit for bit; so does n > 1 at step 0 under the gated start (a cell's `start: gated`,
scalelab.hidden_decoding.gate), where the last stream reads E_1 and the hidden streams through a gate per
mixing layer that starts at 0. The earlier dense stream-major implementation (an (nT)² boolean mask) is
kept as the test oracle and benchmark baseline in scalelab.hidden_decoding.dense.

A scalelab pretrain cell enters through its folded Hugging Face export (Qwen3 with QK-norm, or Llama), so one
implementation serves both scalelab and Hugging Face backbones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from scalelab.config import HiddenDecodingModelConfig
from scalelab.hidden_decoding import gate as hidden_decoding_gate, window as stream_window
from scalelab.model.transformer import ModelOutput

BACKBONES = ("llama", "qwen3")


def attended_pairs(kind: str, n: int, T: int, window: int | None = None) -> int:
    """(query, key) pairs one sequence of T tokens attends in one layer of `kind` ("within", "mixing", or "local"
    with a `window` of tokens)."""
    if kind == "within":  # n causal attentions over T positions
        return n * T * (T + 1) // 2
    if (kind == "local") != (window is not None):
        raise ValueError(f"attended_pairs: a window is the local kind's alone (kind {kind!r}, window {window})")
    # query (i,s), s = 1..n, sees n·min(i, window − 1) earlier entries (n·i when mixing) and s of its own token
    w = min(T, window or T)
    earlier = w * (w - 1) // 2 + (T - w) * (w - 1)
    return n * n * earlier + T * n * (n + 1) // 2


def flops_per_token(config, cfg: HiddenDecodingModelConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) of the n-stream model `cfg` on a backbone with Hugging Face
    `config`, counted analytically: 6 × the weights each of the n positions passes (q, k, v, o, gate, up, down per
    layer; the LM head once, on the last stream, plus once per hidden stream under the auxiliary loss), and
    12 × heads·head_dim per attended (query, key) pair, counted by each layer's mask for windows of seq_len tokens."""
    c, n = config, cfg.n_streams
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    H, Hkv, d, L = c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.num_hidden_layers
    layer = d * hd * (2 * H + 2 * Hkv) + 3 * d * c.intermediate_size
    heads = 1 + (n - 1 if cfg.aux_loss_weight else 0)
    # one stream runs every layer as the backbone's causal layer: a local layer's window applies only for n > 1
    mixing, local = set(cfg.mixing(L)), set(cfg.local(L)) if n > 1 else set()
    kinds = ["local" if i in local else "mixing" if i in mixing else "within" for i in range(L)]
    pairs = sum(attended_pairs(k, n, seq_len, cfg.local_window if k == "local" else None) for k in kinds) / seq_len
    if cfg.start == "gated" and n > 1:  # the last stream's own causal attention beside each mixing one
        pairs += kinds.count("mixing") * attended_pairs("within", 1, seq_len) / seq_len
    return 6.0 * (n * L * layer + heads * d * c.vocab_size) + 12.0 * H * hd * pairs


class StreamCache:
    """Preallocated KV cache of an n-stream model: every layer keeps the keys and values of all n streams of every
    token seen, written in place (no concatenation per token).

    Within-stream layers hold them per stream, [B·n, kv_heads, tokens, head_dim] (row b·n + s: only stream s's
    entries, so these layers read nothing else); mixing layers in token-major order, [B, kv_heads, n·tokens,
    head_dim]. Buffers hold `max_tokens` tokens (grown by doubling past that, or when None). The backbone's
    attention modules call `update` (the one method of transformers' Cache protocol they use)."""

    def __init__(self, max_tokens: int | None = None) -> None:
        self.max_tokens = max_tokens
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # layer → (keys, values) written so far (views)
        self._buf: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.length = 0  # tokens seen
        self.new_tokens = 0  # tokens of the forward in progress (set by run_layers)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        per_token = k.shape[2] // self.new_tokens  # 1 in within-stream layers, n in mixing layers
        used, need = self.length * per_token, (self.length + self.new_tokens) * per_token
        buf = self._buf.get(layer_idx)
        if buf is None or buf[0].shape[2] < need:
            size = max(need, (self.max_tokens or 0) * per_token, 2 * buf[0].shape[2] if buf else 0)
            grown = tuple(x.new_empty(*x.shape[:2], size, x.shape[3]) for x in (k, v))
            if buf is not None:
                for new, old in zip(grown, buf):
                    new[:, :, :used] = old[:, :, :used]
            self._buf[layer_idx] = buf = grown
        buf[0][:, :, used:need], buf[1][:, :, used:need] = k, v
        self.kv[layer_idx] = (buf[0][:, :, :need], buf[1][:, :, :need])
        return self.kv[layer_idx]


class HiddenDecodingLM(nn.Module):
    """A Llama/Qwen3 causal LM (transformers) run as an n-stream Hidden Decoding model.

    `forward(idx, targets)` returns scalelab's ModelOutput: logits of the last stream [B, T, V] and the loss, so the
    training layer takes this model like a `Transformer`."""

    def __init__(self, backbone: nn.Module, cfg: HiddenDecodingModelConfig) -> None:
        super().__init__()
        c = backbone.config
        if c.model_type not in BACKBONES:
            raise ValueError(f"Hidden Decoding needs a Llama or Qwen3 backbone, got model_type {c.model_type!r}")
        if any(t != "full_attention" for t in getattr(c, "layer_types", None) or []):
            raise ValueError("Hidden Decoding: the backbone has sliding-window layers; only full attention is "
                             "supported")
        self.backbone, self.cfg, self.n = backbone, cfg, cfg.n_streams
        self.n_layer = c.num_hidden_layers
        mixing, local = cfg.mixing(self.n_layer), cfg.local(self.n_layer)
        # With one stream the mixing mask is the causal mask: every layer takes the backbone's own causal path.
        self.mixing_layers = frozenset(mixing if self.n > 1 else ())
        self.local_layers = frozenset(local if self.n > 1 else ())
        # Our masks rely on SDPA's semantics (None = causal); eager or flash kernels would ignore them. Local layers
        # need the windowed path, which is SDPA for every other call.
        # The gated start's mixing layers go through its own attention function (hidden_decoding_gate).
        self.gated = cfg.start == "gated" and self.n > 1
        backbone.set_attn_implementation(stream_window.ATTENTION if self.local_layers else
                                         hidden_decoding_gate.ATTENTION if self.gated else "sdpa")
        # α_ℓ of each mixing layer (sorted), 0 at init: the last stream's read of the hidden streams
        e0 = backbone.get_input_embeddings().weight
        self.mix_gates = nn.ParameterList(nn.Parameter(torch.zeros(1, device=e0.device, dtype=e0.dtype))
                                          for _ in (sorted(self.mixing_layers) if self.gated else ()))
        # E_2..E_n: copies of the backbone's table E_1 (optional noise). E_1 stays the backbone's (tied LM heads too).
        # Tied tables (the control): every stream reads E_1.
        e1 = backbone.get_input_embeddings().weight
        extra = self.n - 1 if cfg.tables == "separate" else 0
        self.extra_embeds = nn.ModuleList(nn.Embedding(*e1.shape, device=e1.device, dtype=e1.dtype)
                                          for _ in range(extra))
        with torch.no_grad():
            for table in self.extra_embeds:
                table.weight.copy_(e1 + cfg.embed_noise * e1.float().std() * torch.randn_like(e1))
        self._mixing_off = False  # set by mixing_off()

    @contextmanager
    def mixing_off(self) -> Iterator[None]:
        """The model with its cross-stream mixing switched off (the premise that the mixing acts compares the trained
        model's loss with and without it): in every mixing layer the last stream's query reads stream n alone, its
        own causal attention (hidden_decoding_gate's o_own, the gate held at α = 0), so the prediction never reads
        the hidden streams and every weight stays as trained. With token positions and the backbone's table on the
        predicting stream (`predictor_table: backbone`) that is the backbone's forward on the trained weights."""
        if self.local_layers:
            raise ValueError("mixing_off: local cross-stream layers have no own-stream path (set local_layers [])")
        if self.n == 1 or self._mixing_off:
            yield
            return
        impl = self.backbone.config._attn_implementation
        self.backbone.set_attn_implementation(hidden_decoding_gate.ATTENTION)
        self._mixing_off = True
        try:
            yield
        finally:
            self._mixing_off = False
            self.backbone.set_attn_implementation(impl)

    # ---------------------------------------------------------------- layout
    def embeddings(self) -> list[nn.Embedding]:
        """The table of each stream: E_1..E_n (E_1 n times under tied tables). Under the gated start, or with
        `predictor_table: backbone`, the last stream, the one that predicts, reads the backbone's own E_1 and the
        hidden streams the copies, so that at step 0 it reads its token as the backbone does whatever the copies'
        noise (under the gate it is then the backbone exactly)."""
        e1 = self.backbone.get_input_embeddings()
        if self.cfg.tables != "separate":
            return [e1] * self.n
        last = self.gated or self.cfg.predictor_table == "backbone"
        return [*self.extra_embeds, e1] if last else [e1, *self.extra_embeds]

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """[B, T] token ids → [B, n, T, d]: stream s reads table E_s."""
        return torch.stack([table(idx) for table in self.embeddings()], dim=1)

    def positions(self, tokens: torch.Tensor, layer_kind: str = "within") -> torch.Tensor:
        """RoPE positions [n, T] (stream-major) of the streams of `tokens` (token indices [T]) in a layer of
        `layer_kind`: i, or n·i + s (config POSITIONS)."""
        if self.cfg.position_kind(layer_kind) == "token":
            return tokens[None, :].expand(self.n, -1)
        return self.n * tokens[None, :] + torch.arange(self.n, device=tokens.device)[:, None]

    def layer_kind(self, layer: int) -> str:
        return "local" if layer in self.local_layers else "mixing" if layer in self.mixing_layers else "within"

    # ---------------------------------------------------------------- the layer loop
    def run_layers(self, h: torch.Tensor, cache: StreamCache | None = None,
                   hidden_out: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Run the backbone's decoder layers on stream-major embeddings h [B, n, T, d] (tokens following those in
        `cache`, which is updated); returns the stream-major residual stream before the final norm. `hidden_out`
        collects every layer's output (stream-major views)."""
        B, n, T, d = h.shape
        start = cache.length if cache is not None else 0
        if cache is not None:
            cache.new_tokens = T
        tok = torch.arange(start, start + T, device=h.device)
        w = self.cfg.local_window
        # mask None: SDPA's causal path (or one query token); a local layer's full-sequence forward: the window path
        rope, masks = {}, {"within": None, "mixing": None, "local": None}
        for kind in {self.layer_kind(i) for i in range(self.n_layer)}:
            cos, sin = self.backbone.model.rotary_emb(h, self.positions(tok, kind))  # [n, T, head_dim]
            if kind == "within":  # row b·n + s of the folded batch
                rope[kind] = (cos.repeat(B, 1, 1), sin.repeat(B, 1, 1))
            else:  # token-major entry n·i + s
                rope[kind] = tuple(x.transpose(0, 1).reshape(1, T * n, -1) for x in (cos, sin))
        if start:  # new entries after cached ones: causal with an offset (SDPA's is_causal aligns top-left)
            per_token = {"within": 1, "mixing": n, "local": n}
            for kind, p in per_token.items():
                if kind == "within" and T == 1:
                    continue
                q = torch.arange(p * T, device=h.device)[:, None] + p * start
                keys = torch.arange(p * (start + T), device=h.device)[None, :]
                allowed = keys <= q
                if kind == "local":  # from the first stream of token i − w + 1 on
                    allowed &= keys >= n * (q // n - w + 1)
                masks[kind] = allowed[None, None]
        window = {"hd_window": (n, w)} if masks["local"] is None else {}
        gate = dict(zip(sorted(self.mixing_layers), self.mix_gates))
        if self._mixing_off:  # every mixing layer's last stream on its own-stream attention alone (α = 0)
            gate = {i: h.new_zeros(1) for i in self.mixing_layers}
        layout = "stream"  # h is [B, n, T, d] (stream-major); "token": [B, T, n, d] (token-major)
        for i, layer in enumerate(self.backbone.model.layers):
            kind = self.layer_kind(i)
            if (kind == "within") != (layout == "stream"):  # the one copy: where the layout changes
                h, layout = h.transpose(1, 2).contiguous(), "stream" if kind == "within" else "token"
            x = h.reshape(B * n, T, d) if kind == "within" else h.reshape(B, T * n, d)
            extra = window if kind == "local" else {"hd_gate": (n, gate[i])} if i in gate else {}
            x = layer(x, attention_mask=masks[kind], position_embeddings=rope[kind], past_key_values=cache, **extra)
            h = x.view(h.shape)
            if hidden_out is not None:
                hidden_out.append(h if layout == "stream" else h.transpose(1, 2))
        if cache is not None:
            cache.length += T
        return h if layout == "stream" else h.transpose(1, 2)

    def stream_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head on [..., d]."""
        return self.backbone.lm_head(self.backbone.model.norm(h))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> ModelOutput:
        """idx [B, T]; targets [B, T] (-100 = ignored). Logits and loss of the last stream only; with
        `aux_loss_weight` > 0, the loss adds that weight times the mean CE of streams 1..n-1 (`aux_loss`)."""
        h = self.run_layers(self.embed(idx))
        logits = self.stream_logits(h[:, -1])
        loss, aux = None, logits.new_zeros((), dtype=torch.float32)
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
            if self.aux_loss_coef and self.n > 1:
                hidden = self.stream_logits(h[:, :-1]).float()  # [B, n-1, T, V]
                aux = F.cross_entropy(hidden.flatten(0, 2), targets[:, None].expand(-1, self.n - 1, -1).flatten(),
                                      ignore_index=-100)
                loss = loss + self.aux_loss_coef * aux
        return ModelOutput(logits, loss, aux)

    @property
    def aux_loss_coef(self) -> float:
        """Weight of `aux_loss` inside `loss` (the trainer logs the last-stream CE apart)."""
        return self.cfg.aux_loss_weight

    # ---------------------------------------------------------------- decoding
    @torch.no_grad()
    def step(self, idx: torch.Tensor, cache: StreamCache) -> torch.Tensor:
        """Last-stream logits [B, T, V] of tokens idx [B, T] that follow the cached ones; updates the cache."""
        return self.stream_logits(self.run_layers(self.embed(idx), cache)[:, -1])

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Continue idx [B, T] by `max_new_tokens`: greedy at temperature 0, else sampling (optionally top-k).
        One forward over the prompt, then one token (n positions) per step against the KV cache."""
        cache = StreamCache(idx.shape[1] + max_new_tokens)
        logits = self.step(idx, cache)[:, -1]
        out = [idx]
        for k in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits.float() / temperature
                if top_k is not None:
                    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            out.append(nxt)
            if k + 1 < max_new_tokens:
                logits = self.step(nxt, cache)[:, -1]
        return torch.cat(out, dim=1)

    # ---------------------------------------------------------------- accounting, for the trainer and optimizer
    def num_params(self, non_embedding: bool = False) -> int:
        n = sum(p.numel() for p in self.parameters())  # tied weights once
        if non_embedding:
            n -= sum(t.weight.numel() for t in {id(t): t for t in self.embeddings()}.values())
            if not self.backbone.config.tie_word_embeddings:
                n -= self.backbone.lm_head.weight.numel()
        return n

    def flops_per_token(self, seq_len: int) -> float:
        return flops_per_token(self.backbone.config, self.cfg, seq_len)

    def param_kind(self, name: str) -> str:
        """The optimizer kind (scalelab.optim) of a parameter: embedding tables and LM head "embedding", matrices
        "matrix", QK-norm γ "output_scale" (attention temperature), other norm γ "input_scale"; vectors that are
        neither (biases) "output_scale", i.e. AdamW without decay by default."""
        if not hasattr(self, "_ndim"):
            self._ndim = {k: p.ndim for k, p in self.named_parameters()}
        if name not in self._ndim:
            raise KeyError(f"{name!r} is not a parameter of this model")
        if name.startswith("mix_gates."):  # a gate's scale: never decayed towards the closed gate
            return "output_scale"
        if name.startswith("extra_embeds.") or name.endswith(("embed_tokens.weight", "lm_head.weight")):
            return "embedding"
        if self._ndim[name] >= 2:
            return "matrix"
        if name.endswith(("q_norm.weight", "k_norm.weight")):
            return "output_scale"
        return "input_scale" if name.endswith("norm.weight") else "output_scale"
