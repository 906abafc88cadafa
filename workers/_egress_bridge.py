"""Inside the sandbox: ``127.0.0.1:<port>`` forwarded to the egress proxy's socket, then a command.

Run by the system's Python as ``python3 -I -S _egress_bridge.py PORT SOCKET -- COMMAND...`` in a
sandbox whose network namespace holds nothing but its loopback. It listens on the loopback,
forwards each connection to the worker's egress proxy (:mod:`workers.egress`) through the Unix
socket bound into the sandbox, and runs ``COMMAND`` as its child with stdin, stdout and stderr
inherited (an MCP stdio server speaks through them), passes on the signals that stop it, and
exits with the command's status. Standard library only, and nothing runs at import.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import threading

__all__ = ["main"]

_CHUNK = 65536


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(_CHUNK):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def _forward(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_forward, args=(client, path), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: _egress_bridge.py PORT SOCKET -- COMMAND...", file=sys.stderr)
        return 2
    port, path, command = int(argv[0]), argv[1], argv[3:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"cannot start {command[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda number, _frame: child.send_signal(number))
    code = child.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
