"""The GPU numbers the cost table assumes, measured the day a GPU is lent (docs/scale.md). One JSON line per
figure, ≤ 5 minutes on one H100/H200; without CUDA one line `{"benchmark": "gpu_check", "skipped": ...}` and exit 0.

    python benchmarks/gpu_check.py [--quick]

1. bf16 matmul throughput (8192³, the best of several timed runs) against the device table's dense peak
   (benchmarks/preset_costs.py DEVICES) and against Lightning's table (the MFU denominator scalelab.train.fit uses);
2. the SDPA backend torch actually selects for the 0.12B attention shape (bf16, causal), by the kernel it launches;
3. a pretrain step (forward, backward, AdamW) at gpu-0.12b's size `m` and micro-batch, bf16 autocast, MFU eager and
   compiled (same model, same batches);
4. Hidden Decoding's mixing layer at n = 4 and 8 streams on a one-layer Qwen3-0.6B-width backbone: forward+backward
   time and peak memory, through whatever HiddenDecodingLM/HiddenDecodingModelConfig the checkout has;
5. one SigmaScale step on a 4096×14336 map (fp32 SVD + backward: the cost table's dearest term);
6. calibration throughput: `compress.calibrate.collect` tokens/s on two decoder blocks of 8B width (bf16).
A figure that fails prints its error line and the others still run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
ROOT = Path(__file__).resolve().parents[1]


def emit(metric: str, value, **extra) -> None:
    print(json.dumps({"benchmark": "gpu_check", "metric": metric, "value": value, **extra}), flush=True)


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of `fn` on the GPU (CUDA events), after one warm-up."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return sorted(times)[len(times) // 2]


def device_peak() -> tuple[str | None, float | None]:
    from preset_costs import DEVICES

    name = torch.cuda.get_device_name()
    key = next((k for k in DEVICES if k.split()[0].lower() in name.lower()), None)
    return key, DEVICES[key]["bf16_dense"] if key else None


def matmul_peak(quick: bool) -> float:
    from lightning.fabric.utilities.throughput import get_available_flops

    n = 8192
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    best = min(timed(lambda: a @ b, 5 if quick else 20) for _ in range(3))
    flops = 2 * n**3 / best
    key, table = device_peak()
    lightning = get_available_flops(torch.device("cuda"), torch.bfloat16)
    emit("bf16_matmul_tflops", round(flops / 1e12, 1), device=torch.cuda.get_device_name(), table_key=key,
         table_dense_tflops=table and table / 1e12, fraction_of_table=table and round(flops / table, 3),
         lightning_table_tflops=lightning and lightning / 1e12)
    return table or flops


def sdpa_backend() -> None:
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    q, k, v = (torch.randn(8, 12, 1024, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.cuda.synchronize()
    ops = sorted({e.key for e in prof.key_averages() if "scaled_dot_product" in e.key or "flash" in e.key.lower()
                  or "efficient" in e.key.lower() or "cudnn" in e.key.lower()})
    backend = next((b for b, tag in (("flash", "flash"), ("cudnn", "cudnn"), ("efficient", "efficient"),
                                     ("math", "_scaled_dot_product_attention_math")) if any(tag in o for o in ops)),
                   "unknown")
    emit("sdpa_backend", backend, ops=ops, goal="in ['flash', 'cudnn', 'efficient']")


def pretrain_mfu(peak: float, quick: bool) -> None:
    from scalelab.config import parse_params
    from scalelab.config.params import read_yaml
    from scalelab.model import Transformer

    params = parse_params(read_yaml(ROOT / "configs/gpu-0.12b.yaml"))  # the preset composed over its base
    pre = params.pretrain
    cfg = params.resolve_model("m", "unified", vocab_size=params.tokenizer.vocab_size, recipe="base")
    micro = pre.batch_size // (pre.devices * pre.num_nodes * pre.accumulate)
    x = torch.randint(0, cfg.vocab_size, (micro, pre.seq_len), device="cuda")
    for compiled in (False, True):
        torch.manual_seed(0)
        model = Transformer(cfg).cuda()
        if compiled:
            model.compile()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        start = time.perf_counter()
        step()  # compiles when compiled
        first = time.perf_counter() - start
        t = timed(step, 5 if quick else 15)
        tokens = micro * pre.seq_len
        emit("pretrain_step_mfu" + ("_compiled" if compiled else "_eager"),
             round(model.flops_per_token(pre.seq_len) * tokens / t / peak, 3), step_s=round(t, 4),
             tokens_per_s=round(tokens / t), first_step_s=round(first, 1), micro_batch=micro, seq_len=pre.seq_len,
             params=model.num_params(), goal=">= 0.40 (preset_costs.MFU)")
        del model, opt
        torch.cuda.empty_cache()


def hidden_decoding_layer(quick: bool) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from scalelab.config import HiddenDecodingModelConfig
    from scalelab.hidden_decoding.model import HiddenDecodingLM
    from preset_costs import ARCHITECTURES

    arch = {k: v for k, v in ARCHITECTURES["Qwen3-0.6B"].items() if k != "model_type"}
    backbone = Qwen3ForCausalLM(Qwen3Config(**{**arch, "num_hidden_layers": 1})).cuda().to(torch.bfloat16)
    x = torch.randint(0, arch["vocab_size"], (4, 1024), device="cuda")
    fields = HiddenDecodingModelConfig.model_fields
    for n in (4, 8):
        # only fields this checkout's config has (the mixing layer's API changes: maskless mixing, per-layer positions)
        kw = {k: v for k, v in {"n_streams": n, "mixing_layers": [0], "attention": "sfa"}.items() if k in fields}
        model = HiddenDecodingLM(backbone, HiddenDecodingModelConfig(**kw)).cuda()
        torch.cuda.reset_peak_memory_stats()

        def step():
            model(x, x).loss.backward()

        t = timed(step, 3 if quick else 8)
        emit(f"hidden_decoding_mixing_layer_n{n}", round(t, 4), unit="s per forward+backward", batch=list(x.shape),
             peak_mem_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2))
        del model
        torch.cuda.empty_cache()


def sigmascale_step() -> None:
    from scalelab.compress.sigmascale import sigmascale

    m, n = 4096, 14336  # Llama-3.1-8B's down_proj: 4096 out, 14336 in
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(m, n, device="cuda", generator=g) / math.sqrt(n)
    x = torch.randn(n, 2 * n, device="cuda", generator=g, dtype=torch.float64)
    gram = x @ x.T
    del x
    k = int(0.6 * m * n / (m + n))
    runs = {}
    for steps in (1, 3):
        torch.cuda.synchronize()
        start = time.perf_counter()
        sigmascale(w, k, gram, max_steps=steps, patience=steps + 1)
        torch.cuda.synchronize()
        runs[steps] = time.perf_counter() - start
    per_step = (runs[3] - runs[1]) / 2
    from preset_costs import DEVICES, thin_svd_flops

    key, _ = device_peak()
    fp32 = DEVICES[key]["fp32"] if key else None
    emit("sigmascale_step_s", round(per_step, 3), map=[m, n], rank=k, setup_s=round(runs[1] - per_step, 2),
         svd_efficiency_of_fp32_peak=fp32 and round(3 * thin_svd_flops(m, n) / per_step / fp32, 4),
         goal="svd efficiency >= 0.05 (preset_costs.SVD_EFFICIENCY)")


def calibration_throughput(quick: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from scalelab.compress.calibrate import collect, decoder_linears
    from preset_costs import ARCHITECTURES

    arch = {k: v for k, v in ARCHITECTURES["Llama-3.1-8B"].items() if k != "model_type"}
    model = LlamaForCausalLM(LlamaConfig(**{**arch, "num_hidden_layers": 2})).cuda().to(torch.bfloat16).eval()
    names = [n for block in decoder_linears(model) for n in block]
    batches = [(torch.randint(0, arch["vocab_size"], (4, 2048), device="cuda"), None) for _ in range(2 if quick else 4)]
    collect(model, batches[:1], names)  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    collect(model, batches, names)
    torch.cuda.synchronize()
    t = time.perf_counter() - start
    tokens = sum(x.numel() for x, _ in batches)
    emit("calibration_tokens_per_s_2_blocks", round(tokens / t), blocks=2, tokens=tokens,
         peak_mem_gb=round(torch.cuda.max_memory_allocated() / 1e9, 2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"benchmark": "gpu_check", "skipped": "no CUDA device (torch.cuda.is_available() is False)"}))
        return 0
    start = time.perf_counter()
    peak = None
    for name, fn in (("bf16_matmul", lambda: matmul_peak(args.quick)), ("sdpa_backend", sdpa_backend),
                     ("pretrain_mfu", lambda: pretrain_mfu(peak, args.quick)),
                     ("hidden_decoding", lambda: hidden_decoding_layer(args.quick)),
                     ("sigmascale_step", sigmascale_step),
                     ("calibration", lambda: calibration_throughput(args.quick))):
        try:
            out = fn()
            if name == "bf16_matmul":
                peak = out
        except Exception as err:  # noqa: BLE001  one figure's failure must not hide the others
            emit(name, None, error=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}")
        torch.cuda.empty_cache()
    emit("wall_s", round(time.perf_counter() - start, 1), goal="<= 300")
    return 0


if __name__ == "__main__":
    sys.exit(main())
