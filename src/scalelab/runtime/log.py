"""Logging for stage processes: one line format on stderr, and the libraries' start-up noise silenced.

A stage's output is read in a terminal, in `dvc repro`'s output and in the Prefect log (the flow streams it there),
so the library logs through `logging` (`logging.getLogger(__name__)`: loggers under `scalelab`), never `print`.
`setup()` runs first in every stage (scalelab.pipeline.stage.stage_main); `quiet_lightning()` runs right after Lightning is
imported, since Lightning sets its own logger to INFO at import. Silenced: Lightning's accelerator banners ("GPU
available ...", "TPU available ..."), its LitLogger advertisement and end-of-fit notice (all INFO), and torch's
LeafSpec deprecation, which Lightning's own pytree helper triggers, and MLflow's INFO lines. Warnings and errors
still show.
SCALELAB_LOG_LEVEL (default INFO) sets scalelab's level. Long loops log their progress every PROGRESS_S (`Every`);
loops of known length report progress with an ETA (`Progress`, `progress`): a bar in a terminal, else a line every
few percent, so a stage under Prefect or with its output in a log says how far it is and how long it has left.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import IO, TypeVar

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATEFMT = "%H:%M:%S"
PROGRESS_S = 10.0  # a progress line from a long loop at most this often
PROGRESS_STEP = 0.05  # `Progress` off a terminal: a line each time another 5% of the total is done ...
PROGRESS_MIN_S = 5.0  # ... at most this often (a loop done within it stays silent) ...
PROGRESS_MAX_S = 60.0  # ... and at least this often while it advances (a slow first 5% still says how it goes)
T = TypeVar("T")

# Libraries whose INFO lines narrate their own machinery in every stage (MLflow: its system-metrics sampler's start and
# stop, database set-up); their warnings and errors still show.
QUIET = ("mlflow",)
# (category, message regex) of warnings the libraries raise about their own internals, not about scalelab's use
NOISE = [
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated"),
]


def setup(level: str | int | None = None) -> None:
    """Configure the `scalelab` loggers once per process: `level` (or SCALELAB_LOG_LEVEL, else INFO) to stderr."""
    logger = logging.getLogger("scalelab")
    level = level or os.environ.get("SCALELAB_LOG_LEVEL", "INFO")
    logger.setLevel(level.upper() if isinstance(level, str) else level)
    if not logger.handlers and not logging.getLogger().handlers:  # else the application's (pytest, Prefect) handle it
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT, DATEFMT))
        logger.addHandler(handler)
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")  # else importing mlflow sets its loggers to INFO
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    for category, message in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)


def quiet_lightning() -> None:
    """Lightning's INFO (banners, advertisement, notices) off; its warnings and errors stay."""
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for category, message in NOISE:
        warnings.filterwarnings("ignore", message=message, category=category)


class Every:
    """Call it in a loop: True at most once per `seconds`, the first time after `seconds`, so long loops (a large
    corpus) log their progress and short ones (the default profile) stay quiet."""

    def __init__(self, seconds: float = PROGRESS_S) -> None:
        self.seconds, self.start = seconds, time.monotonic()
        self._next = self.start + seconds

    def __call__(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self.seconds
        return True

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def duration(seconds: float) -> str:
    """`seconds` as 12s, 3m05s or 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    """Progress of `total` units of work with its ETA (elapsed / done × left): a tqdm bar when `stream` is a
    terminal; else lines on `logger`, one each time the done fraction passes another multiple of `step` (at most
    every `min_interval` s, and at least every `max_interval` s while it advances; the total time at the end once it
    said anything), e.g.
    `evaluate perplexity: 45% (9/20 batches), 1m10s elapsed, ETA 1m26s`. Used as a context manager, or call
    `update(n)` and `close()`; `clock` is for tests."""

    def __init__(self, total: int, desc: str, unit: str = "it", *, step: float = PROGRESS_STEP,
                 min_interval: float = PROGRESS_MIN_S, max_interval: float = PROGRESS_MAX_S,
                 stream: IO[str] | None = None, logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.unit, self.step = max(int(total), 0), desc, unit, step
        self.min_interval, self.max_interval, self.clock = min_interval, max_interval, clock
        self.log = logger or logging.getLogger("scalelab.progress")
        self.done, self.start = 0, clock()
        self._last, self._next, self._lines = self.start, step, 0
        stream = sys.stderr if stream is None else stream
        self.bar = None
        if _isatty(stream) and self.total:
            from tqdm import tqdm

            self.bar = tqdm(total=self.total, desc=desc, unit=unit, file=stream, dynamic_ncols=True, leave=True)

    def update(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        if self.bar is not None:
            self.bar.update(n)
            return
        if not self.total:
            return
        now, fraction = self.clock(), self.done / self.total
        since = now - self._last
        due = (fraction >= self._next - 1e-12 and since >= self.min_interval) or since >= self.max_interval
        if due or (self.done == self.total and self._lines):  # the total time, once it has said anything
            self._last, self._lines = now, self._lines + 1
            self._next = (math.floor(fraction / self.step + 1e-9) + 1) * self.step
            self.log.info(self.line(now))

    def line(self, now: float | None = None) -> str:
        elapsed = (self.clock() if now is None else now) - self.start
        head = f"{self.desc}: {100 * self.done / self.total:.0f}% ({self.done}/{self.total} {self.unit})"
        if self.done >= self.total:
            return f"{head} in {duration(elapsed)}"
        eta = elapsed / self.done * (self.total - self.done) if self.done else math.inf
        return f"{head}, {duration(elapsed)} elapsed, ETA {duration(eta) if math.isfinite(eta) else '?'}"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it", **kwargs) -> Iterator[T]:
    """`items` as they are, with `Progress` over them (`total`: len(items) by default)."""
    total = len(items) if total is None else total  # type: ignore[arg-type]
    with Progress(total, desc, unit, **kwargs) as bar:
        for item in items:
            yield item
            bar.update()


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed, or not a file
        return False
