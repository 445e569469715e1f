"""A listening socket handed down by a parent process: a launcher that binds the port
once and starts several servers on it (the GPU fallback's front-end processes) names its
descriptor in the environment; a server started alone binds its own."""

from __future__ import annotations

import os
import socket

LISTEN_FD_ENV = "MISTRAL_SERVING_LISTEN_FD"


def shares_port() -> bool:
    """Whether this process serves on a socket its parent bound (one of several servers)."""
    return os.environ.get(LISTEN_FD_ENV, "").isdigit()


def listen_socket() -> socket.socket | None:
    """The socket the parent bound for this server, or None (it binds its own)."""
    return socket.socket(fileno=int(os.environ[LISTEN_FD_ENV])) if shares_port() else None


def bind(host: str, port: int) -> list[socket.socket]:
    """The server's port bound (not yet listening) before the model loads, so a port in
    use ends the start at once (OSError) instead of after the load; uvicorn then listens on
    these sockets. Bound as asyncio's `create_server` binds a host: each address it
    resolves to, SO_REUSEADDR, IPv6 sockets IPv6-only."""
    found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(
            (f, k, p, "", a) for f, k, p, _, a in found
        ):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets
