"""Where a pipeline cell runs: each concurrent worker's share of the machine.

Two 2-thread training processes on 2 cores were measured ~10x slower per step than one, from oversubscription. So
every worker running stage cells concurrently gets its own share: cores / workers threads, set for everything a stage
may use (torch through SCALELAB_THREADS, which the pretrain stage prefers over `pretrain.threads`; OpenMP and MKL;
the Rust thread pools of tokenizers and polars), and on GPU nodes its own devices (CUDA_VISIBLE_DEVICES: one cell per
GPU when there are as many workers as GPUs; with more workers than GPUs they take turns on them).

Under the flow's local thread runner the shares form a pool (`open_pool`) that its tasks take one at a time
(`share()`). A Dask or Ray worker process is itself one share: its threads come from its environment (SCALELAB_THREADS,
else the OMP_NUM_THREADS Ray sets per task, else its cores), its GPUs from what the cluster assigned it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path

from scalelab import THREADS_ENV

THREAD_VARS = (THREADS_ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS", "POLARS_MAX_THREADS")
MAX_CPU_WORKERS = 8  # default cells at once on a CPU node: more cores than this go to each cell's threads instead


def local_gpus() -> list[str]:
    """This machine's GPUs as CUDA_VISIBLE_DEVICES entries: that variable's list when set, else /dev/nvidia<N>
    (no CUDA initialisation in the flow's process)."""
    if (visible := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    devices = (p.name.removeprefix("nvidia") for p in Path("/dev").glob("nvidia[0-9]*"))
    return sorted((d for d in devices if d.isdigit()), key=int)


def default_workers() -> int:
    """One worker per GPU on GPU nodes; else one per core, at most MAX_CPU_WORKERS (memory, and DVC's lock turns)."""
    return len(local_gpus()) or min(os.cpu_count() or 1, MAX_CPU_WORKERS)


def thread_env(threads: int) -> dict[str, str]:
    return dict.fromkeys(THREAD_VARS, str(threads))


def shares(workers: int, cores: int | None = None, gpus: list[str] | None = None) -> list[dict[str, str]]:
    """The environment of each of `workers` concurrent cells on this machine."""
    cores = cores or os.cpu_count() or 1
    gpus = local_gpus() if gpus is None else gpus
    threads = max(1, cores // workers)
    per = max(1, len(gpus) // workers) if gpus else 0
    out = []
    for i in range(workers):
        env = thread_env(threads)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[(i * per + j) % len(gpus)] for j in range(per))
        out.append(env)
    return out


def set_torch_threads(configured: int | None) -> None:
    """torch's intra-op threads in a stage process: the share the flow gave this cell (SCALELAB_THREADS) wins over
    the profile's own `threads` (two 2-thread cells on 2 cores run ~10x slower per step than one), else `configured`,
    else torch's default."""
    import torch

    if threads := int(os.environ.get(THREADS_ENV) or 0) or configured:
        torch.set_num_threads(threads)


def worker_share() -> dict[str, str]:
    """The share of a Dask/Ray worker process: its own environment's thread count (or its cores); GPUs as assigned."""
    threads = int(os.environ.get(THREADS_ENV) or os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    return thread_env(threads)


# The flow's stop signal and its running stage processes (flows/pipeline.py stop_stages): module state here, where
# Dask and Ray workers import it, because the flow's own functions travel pickled by value.
STOP = threading.Event()
LIVE: set = set()
LIVE_LOCK = threading.Lock()

_pool: queue.Queue[dict[str, str]] | None = None
_pool_lock = threading.Lock()


def open_pool(workers: int, cores: int | None = None, gpus: list[str] | None = None) -> None:
    """This process's pool of `workers` shares (the flow's local thread runner)."""
    global _pool
    with _pool_lock:
        _pool = queue.Queue()
        for env in shares(workers, cores, gpus):
            _pool.put(env)


def close_pool() -> None:
    global _pool
    with _pool_lock:
        _pool = None


@contextlib.contextmanager
def share() -> Iterator[dict[str, str]]:
    """A share's environment for one cell: from this process's pool (waits for a free one), else the worker's."""
    pool = _pool
    if pool is None:
        yield worker_share()
        return
    env = pool.get()
    try:
        yield env
    finally:
        pool.put(env)


# What Lightning's DDP setup writes into its own process's environment (the rendezvous and the ranks). Left behind
# by an in-process fit, LOCAL_RANK tells the next launch in this process, and every child it starts, that the ranks
# were created externally: Lightning then starts no other rank and rank 0 waits for them forever.
LAUNCH_VARS = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "RANK", "WORLD_SIZE")


@contextlib.contextmanager
def launch_scope() -> Iterator[None]:
    """Around a Lightning fit: the launch variables as they were before it, once it returns or raises (those a
    launcher such as torchrun set for this process are kept, they were there before)."""
    before = {k: os.environ.get(k) for k in LAUNCH_VARS}
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
