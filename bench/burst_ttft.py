"""Where a burst of request starts loses time before the first token (not a test).

Starts the real server under bench/burst_probe.py (the server, its request records' times
and the engine's admission groups written out), then sends `--bursts` bursts of
`--concurrency` streamed /v1/completions (token-id prompts) from `--client-procs`
processes that start together (a shared perf_counter instant: CLOCK_MONOTONIC, the
server's time.monotonic), each on a connection opened and warmed before. Per request:

    sent -> arrived   (the connection's turn on the server's event loop, HTTP head)
    arrived -> parsed (body read, JSON, checks)
    parsed -> admitted (the queue) -> the stream's body started (tokenize, limits, the
        response's head: a streamed request reaches the engine from inside its body)
    -> submitted (handed to the engine)
    submitted -> first token (the engine: its step, its prefill groups)
    first token -> client's first byte (the stream's first event written and read)

and per burst: the spread of each instant over the burst (first to last request), and the
engine's admission groups (the replay engine's steps that carried a first token; the
static engine's prefills, with their prompts and seconds): a burst that arrives spread
out is prefilled in several groups, each stalling the rest.

    python bench/burst_ttft.py                       # replay engine, 5 ms step, 16 x 128/128
    python bench/burst_ttft.py --context .benchcarry/ctx --artifact ART --engine pytorch  # GPU

Prints a table and one JSON line (`--out` appends it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "mistral-trt-truss" / "packages")]

TEXT = re.compile(rb'"text": ?"[^"]')  # a streamed chunk with text
PHASES = (
    ("sent", "arrived_at", "to_arrived"),
    ("arrived_at", "parsed_at", "to_parsed"),
    ("parsed_at", "admitted_at", "to_admitted"),
    ("admitted_at", "stream_started_at", "to_stream_started"),
    ("stream_started_at", "submitted_at", "to_submitted"),
    ("submitted_at", "first_token_at", "to_first_token"),
    ("first_token_at", "received", "to_client"),
)


class _Conn:
    """One keep-alive connection sending streamed requests with an X-Request-Id (so each
    is matched to its server record exactly)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, body: dict, rid: str) -> dict:
        payload = json.dumps(body).encode()
        sent = time.perf_counter()
        self.writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: " + rid.encode() + b"\r\nContent-Length: "
            + str(len(payload)).encode() + b"\r\n\r\n" + payload
        )  # fmt: skip
        await self.writer.drain()
        received, buf = None, b""
        while not buf.endswith(b"0\r\n\r\n") or b"[DONE]" not in buf:
            chunk = await self.reader.read(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            if received is None and TEXT.search(chunk):
                received = time.perf_counter()
            buf = buf[-64:] + chunk
        return {"id": rid, "sent": sent, "received": received, "end": time.perf_counter()}


def _client(job: tuple) -> list[dict]:
    """One client process: open and warm its connections, wait for the shared instant,
    send its share of the burst at once; each request's sent / first-byte / end instants."""
    host, port, bodies, start_at = job

    async def main() -> list[dict]:
        conns = [_Conn(*await asyncio.open_connection(host, port)) for _ in bodies]
        warm = {**bodies[0][1], "max_tokens": 1}
        await asyncio.gather(*(c.post(warm, f"warm-{rid}") for c, (rid, _) in zip(conns, bodies)))
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        rows = await asyncio.gather(*(c.post(b, rid) for c, (rid, b) in zip(conns, bodies)))
        for c in conns:
            c.writer.close()
        return list(rows)

    return asyncio.run(main())


def burst(port: int, args, seed: int) -> list[dict]:
    from client.datasets import token_id_prompts

    items = token_id_prompts(args.concurrency, args.input_len, seed=seed)
    bodies = [
        (f"b{seed}-{i}", {"model": "model", "prompt": item.prompt, "max_tokens": args.output_len,
                          "ignore_eos": True, "temperature": 0.0, "stream": True,
                          "stream_options": {"include_usage": True}})
        for i, item in enumerate(items)
    ]  # fmt: skip
    procs = max(1, min(args.client_procs, args.concurrency))
    start_at = time.perf_counter() + 1.5  # time for the processes to start and warm up
    jobs = [("127.0.0.1", port, bodies[p::procs], start_at) for p in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_client, jobs)
    return [row | {"proc": p} for p, part in enumerate(parts) for row in part]


def match(client: list[dict], server: list[dict]) -> list[dict]:
    """Each client request with its server record (by X-Request-Id)."""
    by_id = {s["id"]: s for s in server}
    return [c | by_id[c["id"]] for c in client if c["id"] in by_id]


def summarize(rows: list[dict], groups: list[dict]) -> dict:
    def ms(values: list[float]) -> dict:
        values = sorted(values)
        return {"p50": round(statistics.median(values) * 1e3, 2), "max": round(values[-1] * 1e3, 2)}

    out: dict = {"requests": len(rows)}
    for a, b, name in PHASES:
        values = [r[b] - r[a] for r in rows if r.get(a) is not None and r.get(b) is not None]
        if values:
            out[name + "_ms"] = ms(values)
    ttft = [r["received"] - r["sent"] for r in rows if r.get("received")]
    out["ttft_ms"] = ms(ttft)
    for key in ("sent", "arrived_at", "parsed_at", "submitted_at", "first_token_at", "received"):
        times = [r[key] for r in rows if r.get(key) is not None]
        if times:
            out[f"spread_{key}_ms"] = round((max(times) - min(times)) * 1e3, 2)
    t0 = min(r["sent"] for r in rows)
    t1 = max(r["first_token_at"] for r in rows if r.get("first_token_at"))
    mine = [g for g in groups if t0 <= g["at"] <= t1 + 1e-3]
    out["engine_groups"] = [
        {k: round(v * 1e3, 2) if k in ("at", "seconds") else v for k, v in g.items()
         if k not in ("probe",)} | {"at": round((g["at"] - t0) * 1e3, 2)}
        for g in mine
    ]  # fmt: skip
    return out


def run_bursts(port: int, args, probe_out: Path, n: int) -> list[dict]:
    """A warm-up burst, then `n` measured ones against a server started under
    burst_probe.py (writing to `probe_out`); each burst's summary."""
    burst(port, args, seed=999)  # imports, connections, the engine's first steps
    out = []
    for b in range(n):
        done = probe_out.read_text().count("\n") if probe_out.exists() else 0
        client = burst(port, args, seed=b)
        time.sleep(0.3)  # the last records written
        lines = [json.loads(x) for x in probe_out.read_text().splitlines()[done:]]
        server = [x for x in lines if x["probe"] == "request"]
        groups = [x for x in lines if x["probe"] == "group"]
        out.append(summarize(match(client, server), groups))
    return out


def print_bursts(bursts: list[dict]) -> None:
    for i, b in enumerate(bursts):
        phases = "  ".join(
            f"{name.removeprefix('to_')} {b[name + '_ms']['p50']:.1f}/{b[name + '_ms']['max']:.1f}"
            for _, _, name in PHASES
            if name + "_ms" in b
        )
        groups = ",".join(f"{g['prompts']}@{g['at']:.0f}" for g in b["engine_groups"])
        print(f"burst {i}: ttft {b['ttft_ms']['p50']:.1f}/{b['ttft_ms']['max']:.1f} ms (p50/max)"
              f" | {phases} | spread sent {b.get('spread_sent_ms')} arrived "
              f"{b.get('spread_arrived_at_ms')} submitted {b.get('spread_submitted_at_ms')} ms"
              f" | groups (prompts@ms) {groups}")  # fmt: skip


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--bursts", type=int, default=5)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--engine", default="replay")
    ap.add_argument("--step-ms", type=float, default=5.0, help="the replay engine's step")
    ap.add_argument("--artifact", type=Path, help="default: the dev model")
    ap.add_argument("--context", type=Path, help="a prepared build context (no truss package)")
    ap.add_argument("--set", action="append", default=[], help="more settings: KEY=VALUE")
    ap.add_argument("--port", type=int, default=8097)
    ap.add_argument("--out", type=Path, help="append the JSON line here")
    ap.add_argument("--label", default="")
    return ap.parse_args()


def server_context(context: Path | None) -> Path:
    """The Truss build context to serve: `context` (its server imports this repo's
    packages), else one rendered from this repo."""
    from mistral_build.local_server import prepare_app_dir, render_build_context
    from mistral_build.paths import CACHE_DIR

    if context is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(ROOT / "mistral-trt-truss/packages"), os.environ.get("PYTHONPATH"))
            if p
        )  # fmt: skip
        return context.resolve()
    rendered = render_build_context(CACHE_DIR / "burst-bench-context")
    prepare_app_dir(rendered)
    return rendered


def main() -> int:
    from mistral_build.dev_model import build_dev_model
    from mistral_build.local_server import launch_server, wait_ready
    from mistral_build.paths import CACHE_DIR

    args = parse_args()
    artifact = args.artifact or build_dev_model()
    context = server_context(args.context)
    settings = {
        "artifact": str(Path(artifact).resolve()),
        "engine": args.engine,
        "max_inflight": "1024",
        "max_waiting": "1024",
        "max_batch_size": str(max(args.concurrency, 16)),
        "replay_step_ms": str(args.step_ms),
    } | ({"device": "cpu"} if args.engine == "replay" else {}) | dict(
        item.partition("=")[::2] for item in args.set
    )  # fmt: skip
    probe_out = Path(tempfile.mkdtemp()) / "probe.jsonl"
    log_path = CACHE_DIR / "burst-bench-server.log"
    log = open(log_path, "w")  # noqa: SIM115
    command = [sys.executable, str(ROOT / "bench" / "burst_probe.py")]
    proc = launch_server(context, args.port, settings, log, {"BURST_PROBE_OUT": str(probe_out)},
                         command)  # fmt: skip
    url = f"http://127.0.0.1:{args.port}"
    try:
        wait_ready(url, proc, 300, log_path)
        bursts = run_bursts(args.port, args, probe_out, args.bursts)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print_bursts(bursts)
    result = {"figure": "burst_ttft", "label": args.label, "engine": args.engine,
              "step_ms": args.step_ms if args.engine == "replay" else None,
              "concurrency": args.concurrency, "client_procs": args.client_procs,
              "input_len": args.input_len, "set": args.set,
              "load_average": os.getloadavg()[0], "bursts": bursts}  # fmt: skip
    line = json.dumps(result)
    print(line)
    if args.out:
        with args.out.open("a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
