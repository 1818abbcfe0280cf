"""Where a cell trains and what that device can do: the torch device of this rank, its peak dense matmul FLOP/s
(the MFU denominator) and the process's peak memory.
"""

from __future__ import annotations

import os
import resource
import time

import torch

PRECISION_DTYPE = {"32-true": torch.float32, "bf16-mixed": torch.bfloat16, "bf16-true": torch.bfloat16}


def device_of(accelerator: str) -> torch.device:
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))  # this rank's GPU, before Lightning's setup
    return torch.device("cpu")


# Dense bf16/fp16 tensor-core peaks (NVIDIA's datasheets give 1,979 and 1,671 TFLOP/s *with sparsity*, twice the
# dense rate) for the chips Lightning's device table gets wrong for MFU: it lists H200's sparse figures, under names
# ("h200 sxm1") the driver does not report ("NVIDIA H200"), so an H200 got half its MFU or a measured 4096² matmul.
DENSE_PEAK = {"h200 nvl": 835.5e12, "h200": 989.5e12}  # most specific first: "h200" is in both names


def datasheet_peak(device_name: str, dtype: torch.dtype) -> float | None:
    """This project's dense peak for a device name as torch reports it, when Lightning's table is wrong for it."""
    chip = device_name.lower()
    if dtype in (torch.bfloat16, torch.float16):
        return next((peak for key, peak in DENSE_PEAK.items() if key in chip), None)
    return None


def peak_flops(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", repeats: int = 5,
               seconds: float = 0.03) -> float:
    """Peak dense matmul FLOP/s of one device in `dtype`: the MFU denominator when params give no `peak_flops`.

    On a GPU its dense datasheet peak (DENSE_PEAK, else Lightning's device table). Otherwise measured: the best of `repeats` short
    timings (each at least `seconds` and 2 matmuls), since whatever else runs on the device only ever slows one down;
    a single timing once read 31 GFLOP/s while another process held the cores and a cell reported MFU 1.63.
    Throughput also raises it to any step's achieved rate, so MFU never exceeds 1."""
    device = torch.device(device)
    if device.type == "cuda":
        from lightning.fabric.utilities.throughput import get_available_flops

        if own := datasheet_peak(torch.cuda.get_device_name(device), dtype):
            return own
        if table := get_available_flops(device, dtype):
            return float(table)
    key = (dtype, str(device), torch.get_num_threads(), repeats, seconds)
    if key not in _MEASURED:  # once a process: 0.17 s a measurement, else paid by every fit of a sweep cell
        _MEASURED[key] = _measure_peak(dtype, device, repeats, seconds)
    return _MEASURED[key]


_MEASURED: dict[tuple, float] = {}


def _measure_peak(dtype: torch.dtype, device: torch.device, repeats: int, seconds: float) -> float:
    n = 4096 if device.type == "cuda" else 512
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = 0.0
    for _ in range(repeats):
        iters, start = 0, time.perf_counter()
        while iters < 2 or time.perf_counter() - start < seconds:
            a @ b
            sync()
            iters += 1
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best


def peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
