"""Serving metrics with the definitions of vLLM's ``benchmarks/benchmark_serving.py``.

Per request (client-side clock, ``time.perf_counter``):

* TTFT: from sending the request to the first chunk that carries text;
* ITL: the gaps between consecutive text chunks (a chunk with several tokens is still one
  gap, exactly as in vLLM's request functions);
* E2E latency: from sending to the end of the answer (``[DONE]`` / end of body);
* TPOT: ``(e2e - ttft) / (output_tokens - 1)``, only for requests with more than one
  output token (the first token is excluded); for goodput a request with one token has
  TPOT 0, as in vLLM.

Over a run: ``request_throughput = completed / duration``, ``output_throughput =
total_output_tokens / duration``, ``total_token_throughput = (input + output) /
duration``, and ``request_goodput = requests meeting every SLO / duration`` where a
request meets an SLO when its value is <= the SLO. Percentiles interpolate linearly
(numpy's default); std is the population std (numpy's default). A statistic over no
samples is ``None`` (vLLM reports 0 there).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2el")


@dataclass
class RequestTiming:
    """One benchmark request, as written to the JSON results."""

    index: int
    success: bool = False
    start: float = 0.0  # seconds since the run started
    ttft: float = 0.0  # seconds
    latency: float = 0.0  # seconds (end-to-end)
    itl: list[float] = field(default_factory=list)  # seconds
    prompt_tokens: int | None = None  # as the server counted them
    output_tokens: int | None = None
    output_tokens_source: str = ""  # "usage", "replay" or "chunks"
    chunks: int = 0
    finish_reason: str | None = None
    generated_text: str = ""
    error: str = ""
    prompt: str | list[int] | list[dict[str, str]] | None = None  # text, token ids or messages

    @property
    def tpot(self) -> float | None:
        """vLLM's TPOT; None when the request has fewer than two output tokens."""
        if self.output_tokens is None or self.output_tokens <= 1:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @classmethod
    def from_times(
        cls,
        index: int,
        start: float,
        arrivals: Sequence[float],
        end: float,
        output_tokens: int | None,
        *,
        run_start: float = 0.0,
        prompt_tokens: int | None = None,
        source: str = "usage",
    ) -> RequestTiming:
        """A successful request from its clock readings (``perf_counter`` seconds): the
        send time, the arrival of each chunk that carried text, and the end."""
        record = cls(index=index, success=True, start=start - run_start)
        record.latency = end - start
        record.ttft = (arrivals[0] if arrivals else end) - start
        record.itl = [b - a for a, b in zip(arrivals, arrivals[1:])]
        record.chunks = len(arrivals)
        record.prompt_tokens = prompt_tokens
        record.output_tokens = output_tokens if output_tokens is not None else len(arrivals)
        record.output_tokens_source = source if output_tokens is not None else "chunks"
        return record

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tpot"] = self.tpot
        return data


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy.percentile's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(
    values: Sequence[float],
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    scale: float = 1000.0,
) -> dict[str, float | None]:
    """mean, median, std and pNN of values (seconds), scaled (to ms by default)."""
    pcts = list(percentiles)
    if not values:
        out: dict[str, float | None] = {"mean": None, "median": None, "std": None}
        out.update({f"p{_pct_name(p)}": None for p in pcts})
        return out
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)
    out = {"mean": mean * scale, "median": percentile(values, 50) * scale, "std": std * scale}
    out.update({f"p{_pct_name(p)}": percentile(values, p) * scale for p in pcts})
    return out


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def parse_slos(items: Iterable[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` -> ``{"ttft": 500.0, "tpot": 50.0}`` (milliseconds)."""
    slos: dict[str, float] = {}
    for item in items:
        for part in item.replace(",", " ").split():
            name, sep, value = part.partition(":")
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"bad SLO {part!r}: use NAME:MS with NAME in {SLO_METRICS}")
            ms = float(value)
            if ms < 0:
                raise ValueError(f"bad SLO {part!r}: negative")
            slos[name] = ms
    return slos


def compute_metrics(
    records: Sequence[RequestTiming],
    duration_s: float,
    slos: dict[str, float] | None = None,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """Every run-level figure, in vLLM's names (``mean_ttft_ms``, ``p99_itl_ms`` ...)."""
    if duration_s <= 0:
        raise ValueError("duration must be positive")
    pcts = list(percentiles)
    ok = [r for r in records if r.success]
    ttfts = [r.ttft for r in ok]
    e2els = [r.latency for r in ok]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    itls = [gap for r in ok for gap in r.itl]
    total_in = sum(r.prompt_tokens or 0 for r in ok)
    total_out = sum(r.output_tokens or 0 for r in ok)
    result: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "output_throughput": total_out / duration_s,
        "total_token_throughput": (total_in + total_out) / duration_s,
        "request_goodput": None,
        "slos_ms": dict(slos or {}),
    }
    if slos:
        good = sum(1 for r in ok if meets_slos(r, slos))
        result["good_requests"] = good
        result["request_goodput"] = good / duration_s
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        for stat, value in summarize(values, pcts).items():
            result[f"{stat}_{name}_ms"] = value
    return result


def meets_slos(record: RequestTiming, slos: dict[str, float]) -> bool:
    """vLLM's goodput test: every given SLO (ms) >= the request's value."""
    values = {"ttft": record.ttft, "tpot": record.tpot or 0.0, "e2el": record.latency}
    return all(slos[name] / 1000.0 >= values[name] for name in slos)


def summary_row(metrics: dict[str, Any]) -> dict[str, Any]:
    """The compact figures of one sweep point (the keys of the GPU results files), taken
    from :func:`compute_metrics`, so every benchmark shares one set of definitions."""

    def ms(name: str, digits: int = 1) -> float | None:
        value = metrics.get(name)
        return None if value is None else round(value, digits)

    return {
        "requests": metrics["completed"],
        "failed": metrics["failed"],
        "output_tokens": metrics["total_output_tokens"],
        "wall_s": round(metrics["duration_s"], 2),
        "output_tok_s": round(metrics["output_throughput"], 1),
        "ttft_ms_p50": ms("median_ttft_ms"),
        "ttft_ms_p99": ms("p99_ttft_ms"),
        "tpot_ms_p50": ms("median_tpot_ms"),
        "itl_ms_p50": ms("median_itl_ms"),
        "itl_ms_p99": ms("p99_itl_ms"),
        "e2e_ms_p50": ms("median_e2el_ms"),
        "mean_tpot_ms": ms("mean_tpot_ms", 2),
    }
