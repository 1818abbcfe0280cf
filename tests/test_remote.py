"""Results travel: a micro build (the data stages and one pretrain cell) pushed by
`python -m scalelab.pipeline.remote push` to the default remote (.dvc/config: a folder under ~, here a throwaway HOME) and to a
real network remote, DVC over SSH to Debian's sshd on 127.0.0.1 with throwaway keys; a fresh `git clone` pulls it,
gets the same bytes and recomputes nothing; the cell's MLflow logged model names its remote location. Without sshd
the SSH case skips on a developer's machine and fails under CI (CI=true, .ci/run)."""

import contextlib
import filecmp
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from mutants import mutant, mutation_checks
from workspace import copy_workspace, seed_check_verdicts

from scalelab.pipeline import remote
from scalelab.tracking import teamserver
from scalelab.tracking import dashboard
from scalelab.runtime import yamlio

pytestmark = pytest.mark.slow
DVC = [sys.executable, "-m", "dvc"]
REMOTE = [sys.executable, "-m", "scalelab.pipeline.remote"]
TARGETS = ["validate", "prepare", "tokenizer", "tokenize", "pretrain@standard-a-0"]
MODEL = "data/pretrain/standard-a-base-0/model/hf"


def _run(cmd, cwd, env):
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert res.returncode == 0, f"{cmd} failed ({res.returncode}):\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}"
    return res.stdout + res.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory, micro_build):
    """The micro slice built and committed (dvc.lock, metrics) in a workspace whose HOME is throwaway: a copy of the
    test run's build of the whole micro DAG (conftest's micro_build) cut down to what `dvc repro TARGETS` leaves, the
    TARGETS' stages' entries in dvc.lock and their outs (its own `dvc repro` of them here cost ~20 CPU s, the same
    stages the build had run). The other stages' outs go with their entries: a push sends what dvc.lock names. What
    else their stages left (a cell's resume checkpoint, ckpt/) is git-ignored and in no out: nothing carries it."""
    base = tmp_path_factory.mktemp("remote")
    ws, home = base / "ws", base / "home"
    home.mkdir()
    env = copy_workspace(micro_build.ws, ws) | {"HOME": str(home)}
    del env["SCALELAB_ROOT"]  # a user's shell: the root is where the command runs (the workspace, or a clone)
    keep = micro_build.needs(TARGETS)
    assert set(TARGETS) <= set(keep) and {r["stage"]: r["status"] for r in micro_build.statuses
                                           if r["stage"] in keep} == dict.fromkeys(keep, "ran")
    lock = yamlio.safe_load((ws / "dvc.lock").read_text())
    assert set(keep) <= set(lock["stages"])
    for stage in set(lock["stages"]) - set(keep):
        del lock["stages"][stage]
        for out in micro_build.info["outs"][stage]:
            if (ws / out).is_dir():
                shutil.rmtree(ws / out)
            else:
                (ws / out).unlink(missing_ok=True)
    (ws / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))
    _run(["git", "add", "-A"], ws, env)
    _run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "built"], ws, env)
    return ws, env


def _uncached(clone: Path) -> set[str]:
    """The outs declared `cache: false`: git carries them, or nothing does."""
    from dvc.repo import Repo

    with Repo(str(clone)) as repo:
        return {str(Path(o.fs_path).relative_to(clone)) for o in repo.index.outs if not o.use_cache}


def _not_carried(clone: Path) -> set[str]:
    """Outs that neither git nor a DVC remote carries: `cache: false` and git-ignored (a resume checkpoint, the
    params check's marker). DVC reports them deleted in any fresh clone; they decide no result."""
    ignored = subprocess.run(["git", "check-ignore", *_uncached(clone)], cwd=clone, capture_output=True, text=True)
    return set(ignored.stdout.split())


def _round_trip(ws, env, clone, remote_args, setup=()):
    """Push from `ws`, clone, pull into the clone: same bytes, nothing to recompute. Returns (push s, pull s)."""
    t0 = time.perf_counter()
    out = _run(REMOTE + ["push", *remote_args], ws, env)
    t1 = time.perf_counter()
    _run(["git", "clone", "-q", str(ws), str(clone)], clone.parent, env)
    seed_check_verdicts(clone, env)  # see test_the_default_remote_round_trip
    for cmd in setup:
        _run(cmd, clone, env)
    pulled = _run(REMOTE + ["pull", *remote_args, *TARGETS], clone, env)
    t2 = time.perf_counter()
    assert "files fetched" in pulled, pulled
    _same_and_clean(ws, env, clone)
    return out, t1 - t0, t2 - t1


def _same_and_clean(ws, env, clone):
    """The clone holds the same bytes in every cached out, `dvc status` is clean but for outs nothing carries, and
    `dvc repro` recomputes nothing."""
    uncached = _uncached(clone)
    with_cache = [o["path"] for s in yamlio.safe_load((ws / "dvc.lock").read_text())["stages"].values()
                  for o in s.get("outs", []) if o["path"] not in uncached]
    assert any(p.endswith("standard-a-base-0/model") for p in with_cache)
    for path in with_cache:  # every cached out, byte for byte
        a, b = ws / path, clone / path
        if a.is_dir():
            # mlflow_run.json: the machine's pointer to the MLflow run that made the out, kept out of it (.dvcignore)
            cmp = filecmp.dircmp(a, b, ignore=[*filecmp.DEFAULT_IGNORES, "mlflow_run.json"])
            assert not (cmp.left_only or cmp.right_only or cmp.diff_files), (path, cmp.report())
        else:
            assert filecmp.cmp(a, b, shallow=False), path
    # `dvc status`: clean but for the outs nothing carries (reported deleted, as outs and as deps downstream)
    status = json.loads(_run(DVC + ["status", "--json", *TARGETS], clone, env).splitlines()[-1] or "{}")
    changes = [(kind, path, what) for entries in status.values() for entry in entries
               for kind, paths in entry.items() for path, what in paths.items()]
    assert {what for _, _, what in changes} <= {"deleted"} and {kind for kind, _, _ in changes} <= {
        "changed outs", "changed deps"}, status
    assert {path for _, path, _ in changes} <= _not_carried(clone), status
    # and nothing recomputes: DVC skips what is only missing, as a colleague's pull leaves it
    assert "Running stage" not in _run(DVC + ["repro", "--allow-missing", *TARGETS], clone, env)


def _linked_url(ws, env) -> str:
    client = MlflowClient(env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name(yamlio.safe_load((ws / "params.yaml").read_text())["tracking"]["experiment"])
    with contextlib.chdir(ws):  # logged models name their folders relative to the project root
        model = client.get_logged_model(dashboard.find_model(client, exp.experiment_id, ws / MODEL))
    return model.tags[remote.URL_TAG]


def test_the_default_remote_round_trip(built, tmp_path, monkeypatch):
    """Through the functions the CLI wraps (scalelab.pipeline.remote.push/pull), in this process, from the project root as
    the CLI runs (logged models name their folders relative to it)."""
    ws, env = built
    for key in ("HOME", "MLFLOW_TRACKING_URI", "PATH"):
        monkeypatch.setenv(key, env[key])
    monkeypatch.chdir(ws)
    clone = tmp_path / "clone"
    t0 = time.perf_counter()
    assert remote.push(root=ws) == 0
    t1 = time.perf_counter()
    _run(["git", "clone", "-q", str(ws), str(clone)], tmp_path, env)
    # the remembered check verdicts, as workspace_copy seeds a workspace's (a clone has no .cache/): the clone's first
    # DVC command (_same_and_clean's repro) otherwise builds every optimizer of the profile (~4.5 CPU s), no subject here
    seed_check_verdicts(clone, env)
    assert remote.pull(TARGETS, root=clone) == 0
    print(f"default remote: push {t1 - t0:.1f} s, clone+pull {time.perf_counter() - t1:.1f} s")
    _same_and_clean(ws, env, clone)
    store = Path(env["HOME"]) / ".cache" / "scalelab" / "dvc-remote"  # .dvc/config's `local`, under HOME
    url, inside = _linked_url(ws, env).split("#")
    assert inside == "hf" and Path(url).is_file() and Path(url).is_relative_to(store)
    assert json.loads(Path(url).read_text())  # the folder's .dir listing, as DVC pushed it


@pytest.fixture
def sshd(tmp_path):
    """Debian's sshd on 127.0.0.1 (a free port), a throwaway host key and user key, key login only; stopped after."""
    sshd_bin = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd_bin) or not shutil.which("ssh-keygen"):
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("CI: no sshd/ssh-keygen (Debian's openssh-server); the SSH remote test cannot be skipped in CI",
                        pytrace=False)
        pytest.skip("no sshd (Debian's openssh-server)")
    d = tmp_path / "sshd"
    d.mkdir()
    for key in ("host", "user"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user.pub").read_text())
    port = teamserver.free_port()
    (d / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1\nPort {port}\nHostKey {d / 'host'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PidFile {d / 'sshd.pid'}\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nSubsystem sftp internal-sftp\n")
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # its privilege-separation folder (Debian's service makes it)
    proc = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(d / "sshd.log", "wb"), start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        assert proc.poll() is None, (d / "sshd.log").read_text()
        host_key = (d / "host.pub").read_text().split()[:2]
        yield {"port": port, "key": d / "user", "known_hosts": f"[127.0.0.1]:{port} {' '.join(host_key)}\n"}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)


def test_an_ssh_remote_round_trip(built, sshd, tmp_path):
    ws, env = built
    ssh_dir = Path(env["HOME"]) / ".ssh"  # the host key is checked: a throwaway known_hosts in the throwaway HOME
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "known_hosts").write_text(sshd["known_hosts"])
    store = tmp_path / "team-remote"
    url = f"ssh://{os.environ.get('USER') or 'root'}@127.0.0.1:{sshd['port']}{store}"
    add = [DVC + ["remote", "add", "--local", "-f", "team", url],
           DVC + ["remote", "modify", "--local", "team", "keyfile", str(sshd["key"])]]
    for cmd in add:
        _run(cmd, ws, env)
    out, push_s, pull_s = _round_trip(ws, env, tmp_path / "clone", ["-r", "team"], setup=add)
    print(f"ssh remote: push {push_s:.1f} s, clone+pull {pull_s:.1f} s")
    assert "pushed to team" in out and (store / "files" / "md5").is_dir()
    linked, inside = _linked_url(ws, env).split("#")
    assert linked.startswith(f"ssh://") and inside == "hf"
    assert (store / linked.split(str(store), 1)[1].lstrip("/")).is_file()  # the folder's .dir object on the server


def test_no_remote_is_one_line_before_any_transfer(built):
    ws, env = built
    res = subprocess.run(REMOTE + ["push", "-r", "nowhere"], cwd=ws, env=env, capture_output=True, text=True)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("scalelab.pipeline.remote: no DVC remote named 'nowhere' (have: local")


@mutant("remote-link-skipped")
def _(monkeypatch):  # a push that leaves the logged models without their remote location
    monkeypatch.setattr(remote, "link_models", lambda root=None, remote=None: 0)


@mutant("remote-url-dvc2-layout")
def _(monkeypatch):  # DVC 2's object layout (<remote>/<2 hex>/<rest>): DVC 3 stores under files/md5/
    real = remote.remote_url
    monkeypatch.setattr(remote, "remote_url", lambda *a, **k: real(*a, **k).replace("/files/md5/", "/"))


test_mutants_are_caught = mutation_checks([
    ("remote-link-skipped", "tests/test_remote.py::test_the_default_remote_round_trip"),
    ("remote-url-dvc2-layout", "tests/test_remote.py::test_the_default_remote_round_trip"),
])
