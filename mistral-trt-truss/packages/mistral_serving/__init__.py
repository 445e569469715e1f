"""Serving code for the mistral-trt-truss Truss: settings, request schema, chat encoding,
streaming text, engines and artifacts. `model/model.py` is a thin adapter over `service`."""
