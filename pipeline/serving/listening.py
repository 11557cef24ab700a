"""The listening socket of `simulacra serve` and `simulacra openenv`, bound before anything slow starts.

uvicorn binds its port only once the app is built: `simulacra serve` on a port another process held loaded the
model first, then printed "serving ... at http://127.0.0.1:PORT/v1" and uvicorn's "[Errno 98] error while attempting
to bind" and exited with status 3 (found by probing, 2026-12-06). Bound here first, a port that cannot be had is one
line naming the fix and status 2 (pipeline/cli.py), before the model loads; uvicorn then serves on this very socket,
so no other process can take the port in between.
"""

import errno
import socket

from pipeline.errors import UserFixableError


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), as uvicorn binds its own: IPv6 for a host with a colon, SO_REUSEADDR so a
    port a stopped server left in TIME_WAIT is free again at once. uvicorn starts listening on it. Port 0 takes a
    free port the system picks; `bound_port` says which."""
    if not 0 <= port <= 65535:  # else socket's OverflowError, a traceback
        raise UserFixableError(f"port {port}: a TCP port is 0-65535 (0 takes a free one): pass another --port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserFixableError(_refusal(host, port, exc)) from None
    return sock


def _refusal(host: str, port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use by another process: stop it, or pass another --port"
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges this user lacks (ports below 1024): pass a --port above 1023"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return (
            f"{host} is not an address of this machine: pass --host 127.0.0.1 (this machine only) "
            "or 0.0.0.0 (every interface)"
        )
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}: pass another --host or --port"


def bound_port(sock: socket.socket) -> int:
    """The port `sock` holds: the one asked for, or the system's pick for port 0."""
    return sock.getsockname()[1]
