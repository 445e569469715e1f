"""One engine process shared by several front-end processes: who starts it, who joins it.

With `frontend_processes` above 1 the server's launcher (`frontend_group.py`) runs that
many front-end processes (each a whole HTTP server) over one engine process. The first
front-end, the owner, starts the engine process as `engine_process: on` always does and
has it listen on a Unix socket for the others; each other front-end, a guest, connects
to that socket instead of starting an engine. The launcher tells each front-end its part
through the environment (a fresh interpreter reads it before anything else): this module
is the one place that writes and reads those variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ROLE_ENV = "MISTRAL_SERVING_ENGINE_ROLE"  # "owner" or "guest"
ADDRESS_ENV = "MISTRAL_SERVING_ENGINE_ADDRESS"  # the engine process's Unix socket for guests
MAX_ADDRESS_BYTES = 100  # sockaddr_un holds 108 bytes on Linux (104 on macOS)


class SharingError(ValueError):
    """The environment names a role or an address that cannot be used."""


@dataclass(frozen=True)
class SharedEngine:
    """This front-end's part in a shared engine: `owner` starts the engine process and
    has it listen on `address`; `guest` connects to `address`."""

    role: Literal["owner", "guest"]
    address: str

    def environ(self) -> dict[str, str]:
        """The variables that hand this part to a front-end process."""
        return {ROLE_ENV: self.role, ADDRESS_ENV: self.address}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SharedEngine | None:
        """This process's part, or None when the engine is not shared (one front-end)."""
        env = os.environ if environ is None else environ
        role, address = env.get(ROLE_ENV, ""), env.get(ADDRESS_ENV, "")
        if not role and not address:
            return None
        if role not in ("owner", "guest"):
            raise SharingError(f"{ROLE_ENV} must be owner or guest, not {role[:40]!r}")
        if not address or not os.path.isabs(address):
            raise SharingError(f"{ADDRESS_ENV} must be an absolute socket path")
        if len(os.fsencode(address)) > MAX_ADDRESS_BYTES:
            raise SharingError(f"{ADDRESS_ENV} is longer than {MAX_ADDRESS_BYTES} bytes")
        return cls(role, address)  # type: ignore[arg-type]  # checked just above
