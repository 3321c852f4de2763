"""Rule script jobs started from a process that has imported their libraries already.

A rule's script job is a new Python process (Snakemake runs ``sys.executable <script>``) that
spends 1.2 to 3.5 of its ~4 CPU-seconds importing torch, numpy, scipy, h5py and transformers
before it reads its first input: on the tests' tiny runs, most of the suite's CPU time. This
module, run as a script, is a server that imports those libraries once (nothing of epochlens: the
workflow copy's library is imported by each job, as it would be) and forks one child per job. The
child becomes the process ``python <script>`` would be: the job's working directory, environment,
standard streams (the launcher's own, passed over the socket), ``sys.argv`` and ``sys.path`` (the
script's folder, then the job's PYTHONPATH, then the interpreter's own), fresh seeds for
``random`` and numpy's global generator, and the thread counts Snakemake gives the job. It then
runs the script as ``__main__`` and exits the normal way (a traceback and status 1 on an
exception). The server is single-threaded, so forking it is safe.

The client side is a launcher, a small executable written next to the server's socket: the
Snakemake server (tests/snakemake_server.py) sets it as ``sys.executable`` of the Snakemake
commands that ask for it, so Snakemake starts script jobs through it. The launcher sends a
``.snakemake/scripts/*.py`` job to the server, forwards SIGINT and SIGTERM to it and exits with
its status; anything else (``-m snakemake ...``, a version check) it runs with the real
interpreter. A job whose import-time settings (PYTHON*, HF_*, TRANSFORMERS_*, MPL*, TORCH*)
differ from the server's also runs with the real interpreter.

What the server cannot give: Snakemake's benchmark files measure the launcher's process tree,
which no longer holds the job, so tests that read ``max_rss`` run their jobs the real way
(``wfutil.snakemake(..., forked_jobs=False)``).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import random
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path

#: What the jobs of the tests' runs import; each is imported once, by the server. Nothing that
#: imports pandas (scikit-learn, the Trainer, datasets): the light jobs import it without pyarrow
#: (scripts/_no_pyarrow.py), the others with it, as they would in a process of their own.
PRELOAD = (
    "numpy",
    "scipy.linalg",
    "scipy.sparse",
    "scipy.stats",
    "torch",
    "h5py",
    "safetensors.torch",
    "yaml",
    "tqdm",
    "matplotlib.pyplot",
    "threadpoolctl",
    "transformers",
    "transformers.modeling_utils",
    "tokenizers",
)
#: Environment variables read as libraries are imported: a job with other values than the
#: server's runs with the real interpreter. Not TORCHINDUCTOR_*: importing the Trainer sets its
#: cache folder in the importing process (a test's), which then told every later job apart.
IMPORT_TIME = ("PYTHON", "HF_", "TRANSFORMERS_", "MPL", "TORCH_", "CUDA", "PYTORCH")
#: Thread counts Snakemake sets for a job (its rule's threads).
THREADS = "OMP_NUM_THREADS"
LAUNCHER = """#!{python} -S
import json, os, signal, socket, sys
argv = sys.argv[1:]
job = len(argv) == 1 and argv[0].endswith(".py") and "/.snakemake/scripts/" in argv[0]
if job:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({socket!r})
    request = {{"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}}
    socket.send_fds(sock, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
    reply = sock.makefile("r")
    first = reply.readline().strip()
    if first.startswith("fallback"):
        sys.stderr.write("job server (tests/job_server.py): not forked, %s differ\\n" % first[9:])
    else:
        pid = int(first)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, f: os.kill(pid, s))
        status = reply.readline().strip()
        if not status:
            sys.stderr.write("job server (tests/job_server.py): no status for job %d\\n" % pid)
            sys.exit(1)
        code = int(status)
        sys.exit(code if code >= 0 else 128 - code)
os.execv({python!r}, [{python!r}, *argv])
"""


#: Settings a job's child takes from its own environment (sys.path, bytecode writing).
OWN = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")


def _import_settings(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k not in OWN}


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The launcher's request (JSON, a line) and its three standard streams."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        if not more:
            raise ConnectionError("the launcher closed its socket mid-request")
        data += more
    return json.loads(data), fds


def _become_job(request: dict, fds: list[int], env: dict, base_path: list[str]) -> None:
    """In the forked child: the process ``python <script>`` would be, then the script."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    script = os.path.abspath(request["argv"][0])
    pythonpath = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.path.dirname(script), *pythonpath, *base_path]
    sys.argv[:] = request["argv"]
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    random.seed()
    sys.modules["numpy"].random.seed()
    if env.get(THREADS, "").isdigit():
        sys.modules["threadpoolctl"].threadpool_limits(int(env[THREADS]))
        sys.modules["torch"].set_num_threads(int(env[THREADS]))
    runpy.run_path(script, run_name="__main__")  # its globals are dropped: open files close


def _run_job(request: dict, fds: list[int], env: dict, base_path: list[str]) -> None:
    """The job's process to its end: the script, then the interpreter's exit without tearing
    down the thousands of modules preloaded (which took a forked child over a second): what is
    the script's is closed as its globals are dropped, then garbage, threads, atexit, streams."""
    try:
        _become_job(request, fds, env, base_path)
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException as exc:  # the traceback from the script's frame on, as Python prints it
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != request["argv"][0]:
            tb = tb.tb_next
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        code = 1
    gc.collect()
    threading._shutdown()  # joins non-daemon threads, as the interpreter's exit does
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _handle(conn: socket.socket, settings: dict, added: dict, base_path: list[str]) -> None:
    """In a child of the server: fork the job, tell the launcher its pid and then its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _receive(conn)
    if (theirs := _import_settings(request["env"])) != settings:
        differ = sorted(k for k in set(theirs) | set(settings) if theirs.get(k) != settings.get(k))
        conn.sendall(f"fallback {' '.join(differ)}\n".encode())
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_job(request, fds, {**added, **request["env"]}, base_path)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
    os._exit(0)


def serve(path: str) -> None:
    """Import :data:`PRELOAD`, then fork a handler per connection on the socket at ``path``."""
    before = dict(os.environ)
    for name in PRELOAD:
        __import__(name)
    assert "pandas" not in sys.modules, "a preloaded module imports pandas: see PRELOAD"
    settings = _import_settings(before)
    # What the imports set (e.g. torch's KMP_INIT_AT_FORK): a job's own imports would set it too
    added = {k: v for k, v in os.environ.items() if k not in before}
    gc.freeze()  # the preloaded objects out of the children's collections (and their pages shared)
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in own]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _handle(conn, settings, added, base_path)
        conn.close()


class JobServer:
    """The client: one server per process that uses it, started on first use; ``launcher`` is
    the executable to give Snakemake as ``sys.executable``."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._dir: tempfile.TemporaryDirectory | None = None
        atexit.register(self.close)

    @property
    def launcher(self) -> str:
        if self._proc is None or self._proc.poll() is not None:
            self.close()
            self._dir = tempfile.TemporaryDirectory(prefix="jobserver-")
            path = os.path.join(self._dir.name, "socket")
            self._proc = subprocess.Popen(
                [sys.executable, __file__, path], stdout=subprocess.PIPE, text=True,
                cwd=self._dir.name, env={k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"},
            )  # fmt: skip
            if self._proc.stdout.readline().strip() != "ready":
                raise RuntimeError(f"the job server (tests/job_server.py) exited {self._proc.wait()}")
            launcher = Path(self._dir.name) / "python"
            launcher.write_text(LAUNCHER.format(python=sys.executable, socket=path))
            launcher.chmod(0o755)
        return str(Path(self._dir.name) / "python")

    def close(self) -> None:
        """End the server (also at exit) and remove its folder."""
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
            self._proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


if __name__ == "__main__":
    serve(sys.argv[1])
