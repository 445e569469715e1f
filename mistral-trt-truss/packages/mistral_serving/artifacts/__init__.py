"""Artifacts: what to serve (a local dir, a mount or a pinned Hub snapshot), its manifest,
the bounds on every file the server parses, and the volume fill."""
