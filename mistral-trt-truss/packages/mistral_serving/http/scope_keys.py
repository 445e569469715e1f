"""Keys the server's ASGI layers leave in a request's scope for the layers inside them
(one place, so the body guard, the protocols and the frontend agree without importing
each other)."""

from __future__ import annotations

# A list in the scope of each guarded request: the frontend appends to it when the request
# reaches it (and counts it); one that never did was answered by Truss alone.
HANDLED = "mistral.handled"
# scope["extensions"][CUT_EXTENSION](abort: bool): end the response unfinished on purpose
# (set by http_limits' protocols).
CUT_EXTENSION = "mistral.cut"
# scope["extensions"][LEFT_EXTENSION](callback) -> unwatch: `callback()` runs once if the
# client's connection closes before the response is complete (set by http_limits' protocols;
# it replaces a task per response that waits on `receive` for the disconnect).
LEFT_EXTENSION = "mistral.on_client_left"
