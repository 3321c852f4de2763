"""`python -m snakemake`, run many times a session without paying for its imports each time.

A Snakemake command spends ~1.1 of its ~1.8 CPU-seconds importing Snakemake and its plugins (the
SLURM executor plugin imports pandas) before it reads an argument, and the suite runs ~200 of them
on 2 cores. This module, run as a script, is a server that imports them once and forks one child
per command. The child becomes what `python -m snakemake ARGS` would be (the working directory,
environment, sys.path[0], sys.argv and stdin /dev/null of the request; stdout and stderr into one
file), runs Snakemake's own __main__ and exits the normal way. Only imports are shared: the server
runs no Snakemake code and imports nothing of epochlens (the Snakefile imports its workflow
copy's). The server is single-threaded, so forking it is safe (forking a pytest worker, which has
threads, would not be). Client: :class:`SnakemakeServer` (tests/wfutil.py ``snakemake``).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

#: The job launcher (tests/job_server.py) a request's Snakemake is to start its script jobs with.
LAUNCHER = "EPOCHLENS_TEST_JOB_LAUNCHER"


def _preload() -> None:
    """What every Snakemake command imports before it reads its arguments."""
    import snakemake.api  # noqa: F401
    import snakemake.cli  # noqa: F401
    from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

    ExecutorPluginRegistry()  # imports every installed executor plugin (registries are singletons)


def _become_snakemake(request: dict) -> None:
    """In the forked child: the process `python -m snakemake` would be; never returns."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    if os.environ.get(LAUNCHER):  # script jobs started by tests/job_server.py
        sys.executable = os.environ[LAUNCHER]
    sys.argv = ["snakemake", *request["args"]]
    runpy.run_module("snakemake", run_name="__main__", alter_sys=True)
    sys.exit(0)  # Snakemake's main exits itself; this is in case it ever returns


def serve() -> None:
    """Read one JSON request a line from stdin, answer {"returncode": ...} on stdout."""
    _preload()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _become_snakemake(request)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


class SnakemakeServer:
    """The client: one server per process that uses it, started on first use."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen | None = None
        self._startup: dict[str, str] = {}
        atexit.register(self.close)

    def run(self, args: list[str], launcher: str | None = None) -> subprocess.CompletedProcess:
        """``python -m snakemake *args`` here, now: its exit status and output (stdout and stderr
        merged, in order); with ``launcher``, its script jobs started by it (tests/job_server.py)."""
        env = dict(os.environ, **({LAUNCHER: launcher} if launcher else {}))
        with tempfile.NamedTemporaryFile("r", prefix="snakemake-", suffix=".out") as output:
            request = {"args": args, "cwd": os.getcwd(), "env": env, "output": output.name}
            proc = self._server(request["env"])
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            reply = proc.stdout.readline()
            if not reply:
                self.close()
                message = f"the Snakemake server (tests/snakemake_server.py) exited {proc.returncode}"
                raise RuntimeError(message)
            returncode = json.loads(reply)["returncode"]
            text = Path(output.name).read_text(errors="replace")
        return subprocess.CompletedProcess([sys.executable, "-m", "snakemake", *args], returncode, text, "")

    def _server(self, env: dict[str, str]) -> subprocess.Popen:
        """The server, started anew when the PYTHON* variables (read as an interpreter starts:
        PYTHONPATH, ...) are not those it started with, or when it has exited."""
        startup = {k: v for k, v in env.items() if k.startswith("PYTHON")}
        if self._proc is not None and (startup != self._startup or self._proc.poll() is not None):
            self.close()
        if self._proc is None:
            self._proc = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=tempfile.gettempdir(),
                env=env,
            )
            self._startup = startup
        return self._proc

    def close(self) -> None:
        """End the server (also at exit): it exits when its stdin closes."""
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None


if __name__ == "__main__":
    serve()
