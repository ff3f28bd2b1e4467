"""The project's commands (its console scripts, `python -m nplm_repro...`) run as their own processes without paying
their imports each time: a warm interpreter (one per test process) imports the commands' modules once (torch,
Lightning, MLflow, Hydra: about 8 s of CPU), then forks a fresh process for each command, which runs its entry
point with its own arguments, working directory, environment, stdin, stdout and stderr, and exits with its own
exit code.

What a forked command shares with a command started afresh: its own process, pid and signal handlers, its own
children, its atexit handlers and exit code, the same entry point, the same files. What differs: its modules were
imported before its environment was set, so a command whose environment changes what Python or a library reads
at start (PYTHON*, OMP_*, MKL_*, LD_*, COVERAGE_*) runs afresh (`fresh`), as does any command when NPLM_TEST_WARM=0.
Its hash seed is the warm interpreter's, and the objects its imports made are never collected (`gc.freeze`: a
command's exit does not scan them, about 2 s of each command's start and end saved). A test of start-up itself
(imports, the installed script) runs its command afresh with subprocess.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import socket
import subprocess
import sys
import tempfile
from importlib.metadata import entry_points
from pathlib import Path

# Read at start by Python or the libraries a command imports: a command whose environment changes one runs afresh
AT_START = ("PYTHON", "OMP_", "MKL_", "LD_", "COVERAGE_", "MALLOC_")
SET_BY_COMMANDS = "PYTHONWARNINGS"  # a command run in the test process (`in_process`) sets it for its children

WARM = r"""
import gc, importlib, json, os, random, signal, socket, sys
conn = socket.socket(fileno=int(sys.argv[1]))
for module in json.loads(sys.argv[2]):
    importlib.import_module(module)
gc.freeze()  # what was imported is kept, never collected: a forked command neither copies it nor scans it at exit
conn.send(b"ready")
while True:
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    if not message:
        os._exit(0)
    request = json.loads(message)
    pid = os.fork()
    if pid == 0:
        conn.close()
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(number, signal.default_int_handler if number == signal.SIGINT else signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.argv = request["argv"]
        random.seed()
        module, _, function = request["entry"].partition(":")
        if not function:  # python -m module: run as __main__, sys.argv[0] its file, as Python's -m sets it
            import runpy, warnings
            warnings.filterwarnings("ignore", "'.*' found in sys.modules after import of package", RuntimeWarning)
            runpy.run_module(module, run_name="__main__", alter_sys=True)  # imported already: runpy would say so
            sys.exit(0)
        sys.exit(getattr(importlib.import_module(module), function)())
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    _, status = os.waitpid(pid, 0)
    conn.send(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode())
"""


def scripts() -> dict[str, str]:
    """The project's console scripts (nplm-train, ...) by name: their entry points, `module:function`."""
    return {e.name: e.value for e in entry_points(group="console_scripts") if e.value.startswith("nplm_repro.")}


class Warm:
    """One warm interpreter, started on first use and ended with this process."""

    def __init__(self) -> None:
        self.conn: socket.socket | None = None
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}

    def start(self) -> socket.socket:
        if self.conn is not None and self.process is not None and self.process.poll() is None:
            return self.conn
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        modules = sorted({entry.partition(":")[0] for entry in scripts().values()})
        self.env = dict(os.environ)
        command = [sys.executable, "-c", WARM, str(theirs.fileno()), json.dumps(modules)]
        options = {"pass_fds": [theirs.fileno()], "stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL}
        self.process = subprocess.Popen(command, **options)
        theirs.close()
        if ours.recv(64) != b"ready":
            raise RuntimeError(f"the warm interpreter did not start (exit {self.process.wait()})")
        self.conn = ours
        atexit.register(self.stop)
        return ours

    def stop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)

    def fresh(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment must start afresh (see the module's docstring)."""
        if os.environ.get("NPLM_TEST_WARM", "1") == "0":
            return True
        started = self.env or dict(os.environ)
        names = {k for k in (*env, *started) if k.startswith(AT_START) and k != SET_BY_COMMANDS}
        return any(env.get(k) != started.get(k) for k in names)

    def runs(self, command: list[str]) -> bool:
        """Whether `command` is one of the project's: a console script of it, or `python -m nplm_repro...`."""
        if command[:2] == [sys.executable, "-m"]:
            return len(command) > 2 and command[2].startswith("nplm_repro.")
        return Path(command[0]).name in scripts()

    def run(self, command: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        """`command` (one the warm interpreter `runs`) in a process forked from it; as subprocess.run(
        capture_output=True, text=True) gives it."""
        python_m = command[:2] == [sys.executable, "-m"]  # not a console script's own -m (Hydra's multirun)
        entry = command[2] if python_m else scripts()[Path(command[0]).name]
        conn = self.start()
        argv = command[2:] if python_m else command  # python -m: runpy puts the module's file first
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, open(os.devnull, "rb") as null:
            request = {"argv": argv, "cwd": str(cwd), "env": env, "entry": entry}
            socket.send_fds(conn, [json.dumps(request).encode()], [null.fileno(), out.fileno(), err.fileno()])
            pid = json.loads(conn.recv(1 << 16))["pid"]
            conn.settimeout(timeout)
            try:
                code = json.loads(conn.recv(1 << 16))["code"]
            except TimeoutError:
                os.kill(pid, 9)
                conn.settimeout(None)
                conn.recv(1 << 16)
                raise subprocess.TimeoutExpired(command, timeout, text(out), text(err)) from None
            finally:
                conn.settimeout(None)
            return subprocess.CompletedProcess(command, code, text(out), text(err))


def text(file: tempfile._TemporaryFileWrapper) -> str:
    """A captured stream as subprocess.run(text=True) decodes it: the locale's encoding, universal newlines."""
    file.seek(0)
    data = file.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


WARMED = Warm()
