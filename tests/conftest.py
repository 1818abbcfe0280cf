"""Test isolation: no test writes to the project's mlflow.db, .prefect or caches; no network."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# tmpfs when there is one: creating an MLflow sqlite store there takes ~3 s instead of ~8 s.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
_STATE = Path(tempfile.mkdtemp(prefix="scalelab-tests-", dir=FAST_TMP))
atexit.register(shutil.rmtree, _STATE, ignore_errors=True)
# Set before scalelab is imported anywhere, so its setdefault()s keep these.
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_STATE / 'mlflow.db'}"
os.environ["PREFECT_HOME"] = str(_STATE / "prefect")
os.environ["HF_HOME"] = str(_STATE / "hf")
for key, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                   "DVC_NO_ANALYTICS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "MLFLOW_ENABLE_TELEMETRY": "false", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(key, value)

ROOT = Path(__file__).resolve().parents[1]
MICRO = ROOT / "tests" / "micro_params.yaml"


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """Micro models gain nothing from threads, and lose a lot to spinning when the cores are shared."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _mutant(monkeypatch):
    """Under a mutation check (tests/mutants.py) the named broken implementation replaces the real one."""
    if name := os.environ.get("SCALELAB_MUTANT"):
        import mutants

        mutants.apply(name, monkeypatch)
    yield


@pytest.fixture
def micro_params():
    from scalelab.config import load_params

    return load_params(MICRO)


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for every flow test of the session (started slowly on a busy machine)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield
