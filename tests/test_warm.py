"""scalelab.pipeline.warm: a stage handed to the warm server runs as its own process would (argv, directory, environment,
streams, exit status, signals), and runs in place when there is no server."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mutants import assert_caught, mutant

from scalelab.pipeline import forkcheck, warm

SCRIPT = """\
from scalelab.pipeline.handoff import handoff
handoff()
import os, sys, time
print("argv", sys.argv[1:], "cwd", os.getcwd(), "X", os.environ.get("X"), "warm", os.environ.get("SCALELAB_WARM"),
      "child-of", os.getppid(), "pid", os.getpid(), flush=True)
print("stdin", sys.stdin.readline().strip())
print("to stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(60)
if sys.argv[1] == "torch":
    import torch
    torch.set_num_threads(2)
    print("torch", torch.get_num_threads(), float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()))
if sys.argv[1] == "draw":  # unseeded, from generators the server imported
    import random, numpy
    print("draws", random.random(), numpy.random.random())
sys.exit(int(sys.argv[2]))
"""


@pytest.fixture
def served(tmp_path):
    """A warm server preloading torch (as the pipeline's preloads it, one thread per library) and numpy's generators
    (scalelab.train imports them); (socket, server)."""
    (tmp_path / "stage.py").write_text(SCRIPT)
    sock = tmp_path / "warm.sock"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-m", "scalelab.pipeline.warm", "--socket", str(sock), "--preload",
                               "torch", "numpy.random"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not sock.exists():
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline, "the warm server did not start"
        time.sleep(0.2)
    yield sock, server
    server.terminate()
    assert server.wait(timeout=60) == 0 and not sock.exists()  # a clean exit removes its socket


def stage(tmp_path: Path, sock: Path | None, *args: str, **kw) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != warm.WARM_ENV} | {"X": "42"}
    if sock is not None:
        env[warm.WARM_ENV] = str(sock)
    (tmp_path / "sub").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, str(tmp_path / "stage.py"), *args], cwd=tmp_path / "sub", env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_a_handed_off_stage_runs_as_its_own_process_would(tmp_path, served):
    sock, server = served
    proc = stage(tmp_path, sock, "run", "3")
    out, err = proc.communicate("hello\n", timeout=120)
    assert proc.returncode == 3
    assert f"argv ['run', '3'] cwd {tmp_path / 'sub'} X 42 warm None child-of {server.pid}" in out
    assert "stdin hello" in out and "to stderr" in err


def test_torch_works_in_a_forked_stage(tmp_path, served):
    sock, server = served
    out, _ = stage(tmp_path, sock, "torch", "0").communicate("\n", timeout=120)
    assert f"child-of {server.pid}" in out and "torch 2 262144.0" in out


def test_forked_stages_draw_afresh_and_the_server_serves_on_past_ctrl_c(tmp_path, served):
    """Unseeded draws differ between two stages, as between two cold processes (a fork copies the generators' state).
    Ctrl-C signals the terminal's whole foreground group, the server included: it serves on, each stage getting the
    signal from its own process (handoff forwards it)."""
    sock, server = served
    server.send_signal(signal.SIGINT)
    draws = []
    for _ in range(2):
        out, _ = stage(tmp_path, sock, "draw", "0").communicate("\n", timeout=120)
        assert f"child-of {server.pid}" in out, out
        draws.append(out.split("draws")[1].split())
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1], draws


def test_signals_reach_the_stage_and_a_killed_client_ends_it(tmp_path, served):
    sock, _ = served
    for sig, code in ((signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)):
        proc = stage(tmp_path, sock, "sleep", "0")
        child = int(proc.stdout.readline().split()[-1])  # started: "... pid <its pid>"
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == code
        deadline = time.monotonic() + 30
        while _alive(child):
            assert time.monotonic() < deadline, f"the stage outlived its client ({sig.name})"
            time.sleep(0.2)


def test_a_signal_before_the_servers_reply_waits_for_the_forwarder(tmp_path):
    """The server forks the stage, which can start (and print) before its pid reaches the client: a SIGTERM to the
    client in that window must be held and forwarded to the stage's process group, not end the client and orphan
    the stage (seen once in CI: the client died of the signal, -15 instead of 143). A fake server speaks the
    protocol, so the window is held open for as long as the test needs."""
    import socket

    from scalelab.pipeline import handoff

    (tmp_path / "stage.py").write_text(SCRIPT)
    path = tmp_path / "fake.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(str(path))
        srv.listen(1)
        forked = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands for the forked stage
        proc = stage(tmp_path, path, "run", "0")
        conn, _ = srv.accept()
        try:
            request, fds = handoff.recv(conn, maxfds=3)
            for fd in fds:
                os.close(fd)
            assert request["argv"][1:] == ["run", "0"]
            proc.send_signal(signal.SIGTERM)  # before the reply with the stage's pid
            time.sleep(0.5)
            assert proc.poll() is None, f"the client ended on a signal it could not forward yet ({proc.returncode})"
            handoff.send(conn, {"pid": forked.pid})
            assert forked.wait(timeout=30) == -signal.SIGTERM  # held, then forwarded to the stage's group
            handoff.send(conn, {"exit": 128 + signal.SIGTERM})
            assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            conn.close()
            for child in (forked, proc):
                if child.poll() is None:
                    child.kill()
                    child.wait()


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:  # gone: no file, or (ProcessLookupError) reaped between the open and the read
        return False


def test_without_a_server_the_stage_runs_in_place(tmp_path):
    import socket

    (tmp_path / "stage.py").write_text(SCRIPT)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead:
        dead.bind(str(tmp_path / "dead.sock"))  # the socket file a killed server leaves, no one listening
    # not configured, configured but not serving, or its server killed
    for sock in (None, tmp_path / "gone.sock", tmp_path / "dead.sock"):
        out, _ = stage(tmp_path, sock, "run", "0").communicate("hi\n", timeout=120)
        assert "child-of" in out and f"child-of {os.getpid()}" in out  # its parent is this test: no fork


def test_a_server_refuses_when_other_threads_run(tmp_path):
    """OpenBLAS with more than one thread starts a pool at import, which a fork would not carry."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    res = subprocess.run([sys.executable, "-m", "scalelab.pipeline.warm", "--socket", str(tmp_path / "s"), "--preload",
                          "numpy"], env=env, capture_output=True, text=True, timeout=300)
    if (os.cpu_count() or 1) < 2:
        pytest.skip("OpenBLAS starts no pool on one core")
    assert res.returncode == 1 and "not serving" in res.stderr and not (tmp_path / "s").exists()


EDITED = """\
from scalelab.pipeline.handoff import handoff
handoff()
import os
import stagelib
print("value", stagelib.VALUE, "child-of", os.getppid(), flush=True)
"""


def test_a_library_edit_between_two_stages_is_run(tmp_path):
    """The server preloaded the stage's library; an edit to it (same size, so neither size nor a coarse mtime tells)
    must reach the next stage: DVC hashes the edited file. The server refuses while it holds the old code (the stage
    runs cold) and, once idle, re-executes itself: the stage after runs warm again, on the new code."""
    (tmp_path / "stage.py").write_text(EDITED)
    lib = tmp_path / "stagelib.py"
    lib.write_text("VALUE = 1\n")
    sock = tmp_path / "warm.sock"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", "scalelab.pipeline.warm", "--socket", str(sock), "--preload", "stagelib"],
                              cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(sock, server)
        assert _value(tmp_path, sock) == ("1", server.pid)  # served warm
        lib.write_text("VALUE = 2\n")
        value, parent = _value(tmp_path, sock)
        assert value == "2", "the warm server ran the code it imported before the edit"
        _wait_for(sock, server)  # re-executed (same pid) with the new code
        assert _value(tmp_path, sock) == ("2", server.pid)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "stagelib.py changed: restarting" in server.stderr.read()


def _wait_for(sock: Path, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not sock.exists():
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline, "the warm server did not start"
        time.sleep(0.1)


def _value(tmp_path: Path, sock: Path) -> tuple[str, int]:
    out, err = stage(tmp_path, sock).communicate("", timeout=120)
    words = out.split()
    assert words[:1] == ["value"], out + err
    return words[1], int(words[3])


@mutant("warm-blind-to-edits")
def _(monkeypatch):
    """Every content hash the same in the processes this test starts (a sitecustomize on their PYTHONPATH): the
    server sees no edit, as it once did."""
    import tempfile

    site = Path(tempfile.mkdtemp(prefix="mutant-"))
    (site / "sitecustomize.py").write_text(
        "import hashlib\n_md5 = hashlib.md5\nhashlib.blake2b = lambda data=b'', **kw: _md5(b'')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.mutation
def test_the_edit_test_catches_a_blind_server():
    assert_caught("tests/test_warm.py::test_a_library_edit_between_two_stages_is_run", "warm-blind-to-edits")


def test_only_the_projects_own_files_are_hashed(tmp_path, monkeypatch):
    """A venv inside the project (make's .venv) holds installed packages, not the project's code: the server hashes
    the project's modules, never a site-packages file (thousands of torch files before each fork)."""
    from scalelab.pipeline import warm

    site = tmp_path / ".venv" / "lib" / "python3.11" / "site-packages"
    (tmp_path / "src").mkdir()
    site.mkdir(parents=True)
    (tmp_path / "src" / "projmod_w.py").write_text("X = 1\n")
    (site / "installed_w.py").write_text("Y = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.syspath_prepend(str(site))
    import installed_w  # noqa: F401
    import projmod_w  # noqa: F401

    try:
        files = forkcheck.imported_files(tmp_path.resolve())
    finally:
        for name in ("installed_w", "projmod_w"):
            sys.modules.pop(name, None)
    assert str((tmp_path / "src" / "projmod_w.py").resolve()) in {str(Path(f).resolve()) for f in files}
    assert not any("site-packages" in f for f in files), files


@mutant("warm-hashes-installed-packages")
def _(monkeypatch):  # the first version: every imported file under the root, a venv's included
    from scalelab.pipeline import forkcheck

    monkeypatch.setattr(forkcheck, "_project_file", lambda path, root: path.is_relative_to(root))


@pytest.mark.mutation
def test_the_project_files_test_catches_hashing_installed_packages():
    assert_caught("tests/test_warm.py::test_only_the_projects_own_files_are_hashed", "warm-hashes-installed-packages")


def test_a_stage_that_comes_while_its_server_imports_waits_for_it(tmp_path, monkeypatch):
    """The flow starts its server without waiting for its imports: a stage that comes meanwhile waits for the socket
    and runs warm (its own imports would cost as much again); when the starting server dies instead, the stage runs
    in place at once. Each server's preload holds its imports until the stage has come (its marker), then serves or
    dies."""
    (tmp_path / "stage.py").write_text(SCRIPT.replace("handoff()\n", "open('../arrived', 'w').close()\nhandoff()\n", 1))
    hold = ("import os, time\ndeadline = time.monotonic() + 120\n"
            "while not os.path.exists(os.environ['ARRIVED']) and time.monotonic() < deadline:\n    time.sleep(0.05)\n"
            "time.sleep(0.5)\n")  # the stage is in its wait by then
    (tmp_path / "slowlib.py").write_text(hold)
    (tmp_path / "deadlib.py").write_text(hold + "os._exit(3)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("ARRIVED", str(tmp_path / "arrived"))
    for lib, warm_run in (("slowlib", True), ("deadlib", False)):
        (tmp_path / "arrived").unlink(missing_ok=True)
        folder, server = warm.start(tmp_path, preload=(lib,))
        try:
            # a stage that waited out READY_S (300 s) for the dead server would fail this timeout
            out, _ = stage(tmp_path, folder / "warm.sock", "run", "0").communicate("hi\n", timeout=120)
            assert (f"child-of {server.pid}" in out) == warm_run and "child-of" in out, (lib, out)
        finally:
            warm.stop(server)
            shutil.rmtree(folder)


def test_a_flow_preloads_what_its_stages_import_beyond_a_cell(tmp_path):
    """preload_for: the analysis and model-loading stages' imports, for those stages only; a server holding them still
    serves (none of them starts a thread), and its stage finds them imported and plots as a cold process would."""
    assert warm.preload_for(["validate", "pretrain@none-a-0"]) == warm.PRELOAD + warm.DVC_PRELOAD
    # with their commands: the training stack only where one of them runs a stage script (it hands off to the
    # server); a flow of other commands (a user's own scripts, tools) gets DVC alone
    cmds = {"validate": "python stages/validate.py", "pretrain@none-a-0": "python stages/pretrain.py --cell none-a-0",
            "a": "python stage.py a - a.txt", "b": ["python3 tools/b.py", "echo stages/b.py"], "c": None}
    assert warm.preload_for(["a", "pretrain@none-a-0"], cmds) == warm.PRELOAD + warm.DVC_PRELOAD
    assert warm.preload_for(["a", "b", "c"], cmds) == warm.DVC_PRELOAD
    assert warm.preload_for(["a", "d"], cmds | {"d": ["echo start", "python stages/pretrain.py"]})[0] == "scalelab.train"
    extra = set(warm.preload_for(["leaderboard", "evaluate@none-c-0"])) - set(warm.PRELOAD) - set(warm.DVC_PRELOAD)
    assert extra == {"scipy.stats", "matplotlib.pyplot", "transformers:LlamaForCausalLM,Qwen3ForCausalLM"}
    plot = ('if sys.argv[1] == "plot":\n'
            '    print("preloaded", all(m in sys.modules for m in ("scipy.stats", "matplotlib.pyplot")))\n'
            '    import matplotlib\n    matplotlib.use("Agg")\n    import matplotlib.pyplot as plt\n'
            '    plt.plot([0, 1]); plt.savefig("p.png"); print("png", os.path.getsize("p.png") > 0)\n')
    (tmp_path / "stage.py").write_text(SCRIPT.replace('if sys.argv[1] == "draw"', plot + 'if sys.argv[1] == "draw"'))
    folder, server = warm.start(tmp_path, preload=warm.preload_for(["leaderboard"]))
    try:
        out, err = stage(tmp_path, folder / "warm.sock", "plot", "0").communicate("hi\n", timeout=300)
        assert f"child-of {server.pid}" in out and "preloaded True" in out and "png True" in out, (out, err)
    finally:
        warm.stop(server)
        shutil.rmtree(folder)


STAGE = """\
from scalelab.pipeline.handoff import handoff
handoff()
import os, sys
open(sys.argv[1], "w").write(f"{os.getppid()} {open('/proc/self/comm').read().strip()}\\n")
"""


def test_the_flows_dvc_command_runs_in_the_server_and_its_stage_too(tmp_path):
    """`python -m scalelab.pipeline.dvcrun ...` under a server (handoff(module=...)): DVC runs in a child of the
    server with DVC's exit status and streams; it keeps SCALELAB_WARM, so the stage script it starts is served as
    well; a command that fails exits as a cold one does."""
    env = {k: v for k, v in os.environ.items() if k != warm.WARM_ENV}
    for cmd in (["git", "init", "-q"], [sys.executable, "-m", "dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=tmp_path, env=env, check=True, capture_output=True)
    (tmp_path / "stage.py").write_text(STAGE)
    (tmp_path / "dvc.yaml").write_text("stages:\n  s:\n    cmd: python stage.py out.txt\n    deps: [stage.py]\n"
                                       "    outs: [out.txt]\n")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `python` in the cmd: this venv's
    dvcrun = [sys.executable, "-m", "scalelab.pipeline.dvcrun"]
    missing = subprocess.run([*dvcrun, "repro", "--single-item", "nothing"], cwd=tmp_path, env=env,
                             capture_output=True, text=True)
    folder, server = warm.start(tmp_path, preload=warm.DVC_PRELOAD)
    try:
        env[warm.WARM_ENV] = str(folder / "warm.sock")
        while not (folder / "warm.sock").exists():
            assert server.poll() is None, (folder / "warm.log").read_text()
            time.sleep(0.1)
        res = subprocess.run([*dvcrun, "repro", "--single-item", "s"], cwd=tmp_path, env=env, capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0 and "Running stage 's'" in res.stdout, (res.stdout, res.stderr)
        failed = subprocess.run([*dvcrun, "repro", "--single-item", "nothing"], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
    finally:
        warm.stop(server)
    log = (folder / "warm.log").read_text()
    shutil.rmtree(folder)
    parent, name = (tmp_path / "out.txt").read_text().split()
    assert int(parent) == server.pid and name == "scalelab-stage"  # the stage: forked by the server too, so named
    assert "dvc repro --single-item s: exit 0" in log and "served 1 stage(s), 2 DVC command(s)" in log, log
    assert missing.returncode != 0 and failed.returncode == missing.returncode  # DVC's own status, warm or cold
    assert "nothing" in failed.stderr + failed.stdout


def test_a_starting_marker_counts_for_a_live_server_of_that_socket_and_only_for_a_while(tmp_path):
    """What makes a stage wait (handoff.starting): the marker beside the socket names a live process that serves that
    very socket, written less than READY_S ago. A dead server (a zombie not yet reaped, or gone), a pid reused by
    another program or by another socket's server, or a server stuck in its imports past READY_S: no wait."""
    from scalelab.pipeline import handoff

    sock, other = tmp_path / "warm.sock", tmp_path / "other.sock"
    marker = Path(f"{sock}{handoff.STARTING}")

    def fake_server(path: Path) -> subprocess.Popen:  # a command line as warm.start's
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "scalelab.pipeline.warm",
                                 "--socket", str(path)])
        # Until the child execs, /proc shows the forking test's command line (a real server writes its marker
        # itself, after its exec): on a busy machine that lasts long enough to be read here
        deadline = time.monotonic() + 30
        while b"scalelab.pipeline.warm" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the fake server never exec'd"
            time.sleep(0.01)
        return proc

    live, elsewhere = fake_server(sock), fake_server(other)
    try:
        assert not handoff.starting(sock)  # no marker
        for pid, expected in ((live.pid, True), (elsewhere.pid, False), (os.getpid(), False)):
            marker.write_text(str(pid))
            assert handoff.starting(sock) == expected, pid
        marker.write_text(str(live.pid))
        os.utime(marker, (time.time() - handoff.READY_S - 1,) * 2)
        assert not handoff.starting(sock)  # stuck in its imports since
        marker.write_text(str(live.pid))
        live.kill()
        deadline = time.monotonic() + 30
        while _alive(live.pid):  # a zombie: this test has not reaped it
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert not handoff.starting(sock)
        live.wait()
        assert not handoff.starting(sock)  # gone
    finally:
        for proc in (live, elsewhere):
            proc.kill()
            proc.wait()


@mutant("handoff-ignores-a-starting-server")
def _(monkeypatch):
    """Stages never wait for a starting server (a sitecustomize in the processes this test starts)."""
    import tempfile

    site = Path(tempfile.mkdtemp(prefix="mutant-"))
    (site / "sitecustomize.py").write_text("import scalelab.pipeline.handoff as h\nh.starting = lambda path: False\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.mutation
def test_the_waiting_test_catches_a_stage_that_does_not_wait():
    assert_caught("tests/test_warm.py::test_a_stage_that_comes_while_its_server_imports_waits_for_it",
                  "handoff-ignores-a-starting-server")


PROBE_STAGE = """\
import hashlib, os, sys
from pathlib import Path
from scalelab.pipeline.stage import stage_main

def body(params):
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    import importlib
    import torch
    from scalelab.pipeline.warm import PRELOAD

    for spec in PRELOAD:  # what a training stage imports, and the server imported: each sets its defaults
        module, _, attrs = spec.partition(":")
        imported = importlib.import_module(module)
        [getattr(imported, attr) for attr in filter(None, attrs.split(","))]
    start = "warm" if b"scalelab.pipeline.warm" in parent else "cold"
    torch.manual_seed(params.seed)
    x = torch.randn(128, 128)
    # the same in every stage when each runs as a cold one would: a result, torch's threads, what the imports set,
    # where modules load from
    seen = (float((x @ x).sum()), torch.get_num_threads(), sorted(os.environ), sys.path)
    same = hashlib.sha256(repr(seen).encode()).hexdigest()[:16]
    Path(f"out_{sys.argv[1]}.txt").write_text(f"{start} seed {params.seed} {same}\\n")

if __name__ == "__main__":
    sys.exit(stage_main(body, "../params.yaml"))
"""
PROBE_DVC = """\
stages:
  a: {cmd: python stages/probe.py a, outs: [out_a.txt]}
  b: {cmd: python stages/probe.py b, deps: [out_a.txt], outs: [out_b.txt]}
  c: {cmd: python stages/probe.py c, deps: [out_b.txt], outs: [out_c.txt]}
"""


def test_a_plain_dvc_repro_starts_its_stages_warm_from_the_second(tmp_path):
    """`dvc repro` of three stage scripts in a scalelab project: the first runs in its own process, DVC's process then
    starts a warm server that runs the other two as the first ran (the same result, torch threads, environment and
    module path), and the server ends with DVC."""
    from conftest import marked_processes
    from workspace import workspace_copy

    ws = tmp_path / "ws"
    env = workspace_copy(ws) | {"SCALELAB_PROBE_TREE": "1"}
    probe = ws / "probe"
    (probe / "stages").mkdir(parents=True)
    (probe / "stages" / "probe.py").write_text(PROBE_STAGE)
    (probe / "dvc.yaml").write_text(PROBE_DVC)
    env.pop(warm.WARM_ENV, None)
    res = subprocess.run([sys.executable, "-m", "dvc", "repro", "probe/dvc.yaml"], cwd=ws, env=env, capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    outs = {s: (probe / f"out_{s}.txt").read_text().split() for s in "abc"}
    assert [outs[s][0] for s in "abc"] == ["cold", "warm", "warm"] and outs["c"][2] == "0", outs
    assert len({outs[s][3] for s in "abc"}) == 1, outs  # warm as cold
    assert not marked_processes("SCALELAB_PROBE_TREE")  # the server ended with DVC


def test_a_repro_starts_its_server_at_its_second_stage_script(monkeypatch, tmp_path):
    """DVC's command runner, wrapped once: a dry run, a command that is not a stage script (validate's) and the first
    stage script start nothing (a server's imports would cost what that stage's own cost); the second starts one."""
    from types import SimpleNamespace

    from dvc.stage import run as stage_run

    from scalelab.pipeline import repro_warm

    ran, started = [], []
    monkeypatch.setattr(stage_run, "cmd_run", lambda stage, dry=False, run_env=None: ran.append(stage.addressing))
    monkeypatch.setattr(repro_warm, "_start", lambda root: started.append(len(ran)) or monkeypatch.setenv(
        warm.WARM_ENV, str(root / "warm.sock")))
    monkeypatch.delenv(warm.WARM_ENV, raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    repro_warm.install(tmp_path)
    repro_warm.install(tmp_path)  # idempotent: DVC's runner wrapped once
    validate = SimpleNamespace(cmd="python -m scalelab.pipeline.check --stage", addressing="validate")
    script = [SimpleNamespace(cmd=f"python stages/s.py --cell {i}", addressing=f"s@{i}") for i in range(3)]
    stage_run.cmd_run(validate)
    stage_run.cmd_run(script[0], dry=True)
    stage_run.cmd_run(script[0])
    assert started == [] and ran == ["validate", "s@0", "s@0"]
    stage_run.cmd_run(script[1], run_env={})
    stage_run.cmd_run(script[2])
    assert started == [3] and ran[3:] == ["s@1", "s@2"]  # before the second script ran, once
