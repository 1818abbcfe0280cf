"""Logging for stage processes: one line format on stderr, and the libraries' start-up noise silenced (issue 6).

A stage's output is read in a terminal, in `dvc repro`'s output and in the Prefect log (the flow streams it there),
so the library logs through `logging` (`logging.getLogger(__name__)`: loggers under `scalelab`), never `print`.
`setup()` runs first in every stage (scalelab.pipeline.stage.stage_main); `quiet_lightning()` runs right after Lightning is
imported, since Lightning sets its own logger to INFO at import. Silenced: Lightning's accelerator banners ("GPU
available ...", "TPU available ..."), its LitLogger advertisement and end-of-fit notice (all INFO), and torch's
LeafSpec deprecation, which Lightning's own pytree helper triggers, and MLflow's INFO lines. Warnings and errors
still show.
SCALELAB_LOG_LEVEL (default INFO) sets scalelab's level. Long loops log their progress every PROGRESS_S (`Every`).
"""

from __future__ import annotations

import logging
import os
import sys
import time
import warnings

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATEFMT = "%H:%M:%S"
PROGRESS_S = 10.0  # a progress line from a long loop at most this often

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
