"""A `vitkit` command that starts in milliseconds, for tests that run many shell lines.

Each `vitkit` process spends seconds importing torch. ``python cli_server.py SOCKET`` imports it once,
then serves commands on the Unix socket SOCKET: the ``vitkit`` script that ``write_shim`` writes sends its
arguments, working folder, environment and its stdin, stdout and stderr (the file descriptors themselves,
so redirections and pipes behave as in any shell) to the server, which forks a copy of itself that runs
``vitkit.cli.main.main`` there; the script exits with that copy's exit status (128 + N for a signal N).

Commands that start processes of their own (``--nproc 2``, a launcher) start real ``python -m vitkit``
processes, as they always do. Linux only (file descriptors passed over a Unix socket).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

SHIM = '''#!{python} -I
import json, os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.connect({socket!r})
request = json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ)}}).encode()
socket.send_fds(s, [struct.pack("!I", len(request)) + request], [0, 1, 2])
status = s.recv(4)
sys.exit(struct.unpack("!i", status)[0] if len(status) == 4 else 255)
'''


def write_shim(folder: Path, socket_path: str) -> Path:
    """An executable ``folder/vitkit`` that runs its command line on the server at ``socket_path``."""
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "vitkit"
    shim.write_text(SHIM.format(python=sys.executable, socket=socket_path))
    shim.chmod(0o755)
    return shim


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: its JSON (argv, cwd, env) and the client's stdin, stdout and stderr."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    (size,) = struct.unpack("!I", data[:4])
    data = data[4:]
    while len(data) < size:
        data += conn.recv(size - len(data))
    return json.loads(data), fds


def _run(request: dict, fds: list[int]) -> None:
    """In a forked copy: become the client's process (folder, environment, standard streams) and run the
    command; never returns."""
    from vitkit.cli.main import main

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.argv = ["vitkit", *request["argv"]]
    try:
        code = main(request["argv"])
    except SystemExit as e:  # argparse's usage errors and --help
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _handle(conn: socket.socket) -> None:
    """In a forked copy: run one request in a child of its own and send back its exit status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run(request, fds)
    for fd in fds:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    conn.sendall(struct.pack("!i", code if code >= 0 else 128 - code))
    os._exit(0)


def serve(socket_path: str) -> None:
    """Import what every command needs, then serve requests until killed (each in a forked copy)."""
    import torch  # noqa: F401  - the import the commands share
    import vitkit.cli.main  # noqa: F401
    import vitkit.train  # noqa: F401

    server = socket.socket(socket.AF_UNIX)
    server.bind(socket_path)
    server.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the forked handlers are reaped by the kernel
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        if os.fork() == 0:
            server.close()
            _handle(conn)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
