"""Hidden Decoding cost ratios (METHODS §C, DESIGN: Benchmarks convention), all measured in this run:

1. Attention stack, forward + backward, n = 4, T = 512, one mixing layer in every 4: Stream-Factorized Attention
   against `full` (every layer mixing). The speed-up time(full)/time(SFA) as a fraction of the analytic ratio of
   attended (query, key) pairs (≈ 2.3×): goal ≥ 0.8. The stack is what the pair count describes: the SDPA calls of
   each layer on its layout (streams folded into the batch and `is_causal`, or one sequence under the mixing mask),
   run through the model's own layer loop on a backbone whose projections and MLPs are identities.
2. Whole training step (forward, backward, AdamW) of a small Llama at n = 4 (SFA) against n = 1, as a fraction of
   the analytic training-FLOP ratio: goal ≤ 1.15.

Cost is this process's CPU time (one torch thread by default), not wall time: on a shared machine wall time mostly
measures the other processes (here it ran ~9× the CPU time), while CPU time is what the work costs. Calls alternate
between the two sides and each side keeps its median. `--threads N --wall` measures wall time instead (idle machines).

    python benchmarks/hidden_decoding.py [--seq 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from scalelab.config import HiddenDecodingModelConfig
from scalelab.model.hidden_decoding import HiddenDecodingLM, attended_pairs


CLOCK = time.process_time


def alternate(fns: dict[str, callable], repeats: int) -> dict[str, float]:
    """Median time (CLOCK) of each function, calls interleaved (one warm-up each)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for k, fn in fns.items():
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = CLOCK()
            fn()
            times[k].append(CLOCK() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


class Identity(nn.Module):
    def forward(self, x, *args, **kwargs):
        return x


def attention_only(config: LlamaConfig) -> LlamaForCausalLM:
    """A backbone whose layers compute only attention (q, k, v, o and the norms are identities; MLPs return 0), so
    timing its layer loop times the SDPA calls on each layer's layout."""
    model = LlamaForCausalLM(config)
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.q_proj = attn.k_proj = attn.v_proj = attn.o_proj = Identity()
        layer.input_layernorm = layer.post_attention_layernorm = Identity()
        layer.mlp = ZeroMLP()
    return model


class ZeroMLP(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)


def attention_stack(seq: int, repeats: int) -> dict:
    n, layers, d = 4, 4, 128
    cfg = LlamaConfig(vocab_size=16, hidden_size=d, intermediate_size=16, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4)
    models = {kind: HiddenDecodingLM(attention_only(cfg), HiddenDecodingModelConfig(n_streams=n, attention=kind))
              for kind in ("sfa", "full")}
    h = torch.randn(1, n, seq, d, requires_grad=True)

    def run(model):
        return lambda: model.run_layers(h).sum().backward()

    t = alternate({k: run(m) for k, m in models.items()}, repeats)
    pairs = {k: sum(attended_pairs(m.layer_kind(i), n, seq) for i in range(layers)) for k, m in models.items()}
    analytic = pairs["full"] / pairs["sfa"]
    measured = t["full"] / t["sfa"]
    return {"t_sfa": t["sfa"], "t_full": t["full"], "measured": measured, "analytic": analytic,
            "fraction": measured / analytic}


def whole_step(seq: int, repeats: int) -> dict:
    cfg = LlamaConfig(vocab_size=2048, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    backbone = LlamaForCausalLM(cfg)
    x, y = torch.randint(0, 2048, (2, 2, seq))
    models, fns = {}, {}
    for n in (1, 4):
        model = HiddenDecodingLM(LlamaForCausalLM(cfg), HiddenDecodingModelConfig(n_streams=n)).train()
        model.backbone.load_state_dict(backbone.state_dict())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def step(model=model, opt=opt):
            model(x, y).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        models[n], fns[n] = model, step
    t = alternate(fns, repeats)
    flops = {n: m.flops_per_token(seq) for n, m in models.items()}
    measured, analytic = t[4] / t[1], flops[4] / flops[1]
    return {"t_n1": t[1], "t_n4": t[4], "measured": measured, "analytic": analytic, "fraction": measured / analytic}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--step-seq", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--wall", action="store_true", help="wall time instead of this process's CPU time")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    att = attention_stack(args.seq, args.repeats)
    step = whole_step(args.step_seq, args.repeats)
    clock = f"measurement ({'wall' if args.wall else 'CPU'} time, {args.threads} thread(s))"
    print(f"{clock:<52}{'time':>22}{'measured':>10}{'analytic':>10}{'fraction':>10}")
    print(f"{f'attention stack fwd+bwd, n=4, T={args.seq}: full / SFA':<52}"
          f"{att['t_full'] * 1e3:>9.1f} / {att['t_sfa'] * 1e3:>6.1f} ms{att['measured']:>10.2f}{att['analytic']:>10.2f}"
          f"{att['fraction']:>10.2f}")
    print(f"{f'training step, T={args.step_seq}: n=4 SFA / n=1':<52}"
          f"{step['t_n4'] * 1e3:>9.1f} / {step['t_n1'] * 1e3:>6.1f} ms{step['measured']:>10.2f}"
          f"{step['analytic']:>10.2f}{step['fraction']:>10.2f}")
    print(json.dumps({"benchmark": "hidden_decoding", "metric": "attention_speedup_sfa_vs_full_over_pair_ratio",
                      "value": round(att["fraction"], 3), "goal": ">= 0.8"}))
    print(json.dumps({"benchmark": "hidden_decoding", "metric": "step_time_n4_vs_n1_over_flop_ratio",
                      "value": round(step["fraction"], 3), "goal": "<= 1.15"}))


if __name__ == "__main__":
    main()
