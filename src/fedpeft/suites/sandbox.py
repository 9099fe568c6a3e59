"""Running model-written code: never in the fedpeft process. Each program runs in its own Python subprocess, in a
fresh temporary directory that is deleted afterwards, under these limits:

- wall time (``timeout``; the whole process group is killed when it ends, children included) and CPU time
  (``RLIMIT_CPU``);
- memory (``RLIMIT_AS``), size of any file written (``RLIMIT_FSIZE``), no core dumps;
- the interpreter isolated (``-I``: no user site, no environment variables, no current directory on the path) with
  an empty environment;
- an audit hook installed before the program (``sys.addaudithook``, which Python code cannot remove) refuses
  network sockets, new processes (``subprocess``, ``os.system``, ``os.fork``, ``os.exec*``, ``os.spawn*``,
  ``pty``), ``ctypes``, and any file opened for writing, or removed, renamed or created, outside the temporary
  directory.

A program passes when it exits with status 0 within the limits. This is containment for benchmark code that
a model wrote (HumanEval's ``check``), in depth but in user space: it is not a security boundary against an
adversary who controls the model (use a container or a virtual machine for that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path

GUARD = textwrap.dedent('''
    import os, sys
    _root = os.path.realpath(os.getcwd())
    _blocked = ("socket.connect", "socket.bind", "socket.sendto", "subprocess.Popen", "os.system", "os.fork",
                "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.kill", "os.killpg", "pty.spawn",
                "ctypes.dlopen", "ctypes.cdata", "shutil.rmtree", "os.chdir")
    _paths = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
              "os.chmod", "os.chown", "os.utime")

    def _inside(path):
        try:
            return os.path.realpath(os.fspath(path)).startswith(_root + os.sep)
        except TypeError:
            return False  # a file descriptor or another form: refused

    def _hook(event, args):
        if event.startswith(_blocked):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and len(args) > 1 and args[1] is not None and isinstance(args[1], str) and \\
                any(c in args[1] for c in "wax+") and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory")
        if event == "open" and len(args) > 2 and isinstance(args[2], int) and \\
                args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC) and \\
                not isinstance(args[0], int) and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing {args[0]!r} outside the working directory")
        if event in _paths and args and not _inside(args[0]):
            raise PermissionError(f"sandbox: {event} on {args[0]!r} outside the working directory")

    sys.addaudithook(_hook)
    del _hook
''')


@dataclass(frozen=True)
class Outcome:
    """How a program ended: ``passed`` (exit status 0 in time), ``status`` (``passed``, ``failed``, ``timed out``),
    its return code and the tail of its error output."""

    passed: bool
    status: str
    returncode: int | None
    stderr: str


def _limits(cpu_s: int, memory_mb: int, file_mb: int):
    def apply() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(source: str, timeout: float = 10.0, cpu_s: int = 10, memory_mb: int = 1024,
                file_mb: int = 8) -> Outcome:
    """Run ``source`` as a Python program in the sandbox of the module doc."""
    if os.name != "posix":
        raise OSError("the sandbox needs a POSIX system (resource limits, process groups)")
    with tempfile.TemporaryDirectory(prefix="fedpeft-sandbox-") as tmp:
        program = Path(tmp) / "program.py"
        program.write_text(GUARD + "\n" + source, encoding="utf-8")
        proc = subprocess.Popen([sys.executable, "-I", "-B", str(program)], cwd=tmp, env={},
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                preexec_fn=_limits(cpu_s, memory_mb, file_mb), start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
            status = "passed" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status, err = "timed out", b""
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the program and anything it left running
            except ProcessLookupError:
                pass
            proc.wait()
    return Outcome(status == "passed", status, proc.returncode, err.decode("utf-8", "replace")[-500:])
