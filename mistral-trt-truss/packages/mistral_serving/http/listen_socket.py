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
