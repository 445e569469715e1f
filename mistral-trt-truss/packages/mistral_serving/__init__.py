"""Serving code for the mistral-trt-truss Truss: settings, wire formats (`protocols/`),
the frontend (admission, streaming, drain), the generation service, engines, artifacts
and metrics. `model/model.py` is a thin adapter over `frontend`; `server.py` starts the
real Truss server with the routes it lacks."""

__version__ = "0.1.0"  # pyproject.toml's version
