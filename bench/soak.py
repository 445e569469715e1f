"""`make soak`: the reliability soak on the dev model, printing figures (not a test).

Phases, each against a fresh real Truss server (loopback only, bounded in count and time):
1. the bad-input battery and random bodies: count of 5xx answers;
2. 100 mid-stream disconnects: requests left in the engine, gauges back to 0;
3. overload at 4x the limits for `--overload-seconds`: refusal (503) latency p50/p99,
   server CPU per refusal (measured while every slot is held, so the server does nothing else),
   wrong answers (greedy answers compared with a reference), RSS before/after;
4. SIGTERM during 64 streams: how many were cut, and when, against the grace period;
5. a poisoned request (extreme sampling values) inside a busy batch: the other streams
   must match a clean run byte for byte;
6. header floods, for each parser: connections that send 2 MB of header lines, or one
   header value in small pieces: answers (431), server RSS and CPU, `/health` latency;
7. slowloris: 300 connections dripping a header + 100 idle ones, default timeouts: how
   many the server closed, and readiness probes answered meanwhile;
8. slow readers: 40 logprob streams that are never read, `max_inflight` 4: aborts, RSS,
   and how long until another client is served;
9. schema bombs (nested quantifiers, a 700 KB enum, deep nesting) at the default limits and
   with the pattern bound lifted (the timed compile): statuses, bystanders, probes, kills;
10. an lm-eval-style echo+logprobs of a 2,000-token prompt among 16 short requests: RSS peak,
   every answer's status;
11. a stopped engine (`engine_process=on`, worker SIGSTOPped with a request pending): when
   readiness turns 503, when and how the server exits.

`python bench/soak.py --help`; the figures go to docs/reliability.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "mistral-trt-truss" / "packages")]

from client.hostinfo import process_cpu_seconds  # noqa: E402
from client.metrics import percentile  # noqa: E402
from mistral_build.dev_model import build_dev_model  # noqa: E402
from mistral_build.local_server import (  # noqa: E402
    LocalServer,
    dev_settings,
    prepare_app_dir,
    render_build_context,
)
from tests.e2e.test_engine_process_e2e import engine_processes  # noqa: E402
from tests.e2e.test_hostile_input import BATTERY, OUR_ROUTES  # noqa: E402
from tests.e2e.util import scrape  # noqa: E402

PREDICT = "/v1/models/model:predict"


def start(context: Path, **settings: object) -> LocalServer:
    """A dev-model server with these settings, ready."""
    return LocalServer.start(context, dev_settings() | {k: str(v) for k, v in settings.items()})


def cpu_seconds(server: LocalServer) -> float:
    return process_cpu_seconds(server.process.pid) or 0.0


def rss_mb(server: LocalServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def gauge(server: LocalServer, name: str) -> float:
    return scrape(server.url).get((f"mtt:{name}", ()), 0.0)


def stream(url: str, n: int, prompt: str = "busy") -> requests.Response:
    return requests.post(
        url + PREDICT,
        json={"prompt": prompt, "max_new_tokens": n, "streaming": True},
        stream=True,
        timeout=600,
    )


def phase_bad_input(context: Path, fuzz: int) -> dict:
    server = start(context)
    rng = random.Random(0)
    fivexx = 0
    cases = list(BATTERY)
    for _ in range(fuzz):
        route = rng.choice(OUR_ROUTES)
        cases.append((route, rng.randbytes(rng.randrange(0, 300))))
        body = {
            "prompt": "hi",
            "max_new_tokens": 2,
            rng.choice(["temperature", "top_k", "stop", "seed", "messages"]): rng.choice(
                [None, -1, "x", [1], {"a": 1}, 1e308, True]
            ),
        }
        cases.append((route, json.dumps(body).encode()))
    for route, body in cases:
        r = requests.post(server.url + route, data=body, timeout=120)
        fivexx += r.status_code >= 500
    alive = requests.get(server.url + "/health", timeout=30).status_code == 200
    server.stop()
    return {"bodies": len(cases), "5xx": fivexx, "alive_after": alive}


def phase_disconnects(context: Path, n: int = 100) -> dict:
    server = start(context)
    for i in range(n):
        r = stream(server.url, 400, f"disconnect {i}")
        it = r.iter_content(chunk_size=None)
        next(it)
        r.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and gauge(server, "num_requests_running") > 0:
        time.sleep(0.2)
    result = {
        "disconnects": n,
        "running_after": gauge(server, "num_requests_running"),
        "waiting_after": gauge(server, "num_requests_waiting"),
    }
    server.stop()
    return result


# What a full queue answers: this replica is saturated (429 before; docs/reliability.md's
# earlier runs counted 429s).
SATURATED = 503


def phase_overload(context: Path, seconds: float) -> dict:
    inflight, waiting = 4, 4
    server = start(context, max_inflight=inflight, max_waiting=waiting)
    reference = requests.post(
        server.url + PREDICT, json={"prompt": "reference", "max_new_tokens": 8}, timeout=120
    ).json()["output"]
    rss_before = rss_mb(server)
    cpu_per_refusal = refusal_cpu_when_full(server, inflight, waiting)
    time.sleep(1)
    # 4x the limits for `seconds`: 4 * (inflight + waiting) clients in a loop.
    clients = 4 * (inflight + waiting)
    cpu0 = cpu_seconds(server)
    ok, wrong, errors, latencies_refused = overload(server, reference, clients, seconds)
    cpu = cpu_seconds(server) - cpu0
    rss_after = rss_mb(server)
    server.stop()
    return {
        "limits": {"max_inflight": inflight, "max_waiting": waiting},
        "clients": clients,
        "seconds": seconds,
        "answered_200": ok,
        "wrong_answers": wrong,
        "other_errors": errors,
        "refused_503": len(latencies_refused),
        "refusal_latency_ms_p50": round(percentile(latencies_refused, 50) * 1000, 1)
        if latencies_refused
        else None,
        "refusal_latency_ms_p99": round(percentile(latencies_refused, 99) * 1000, 1)
        if latencies_refused
        else None,
        "server_cpu_ms_per_refusal_when_full": cpu_per_refusal,
        "server_cpu_s_during_overload": round(cpu, 1),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(rss_after, 1),
    }


def refusal_cpu_when_full(server: LocalServer, inflight: int, waiting: int) -> dict[str, float]:
    """The server's CPU ms per refusal, by body size: every slot and queue place held with
    long streams, then refusals sent; the holders let go after."""
    holders = [stream(server.url, 100_000) for _ in range(inflight)]
    readers = [h.iter_content(chunk_size=None) for h in holders]  # kept: dropping one closes it
    for reader in readers:
        next(reader)
    waiters = []
    for _ in range(waiting):
        sock = socket.create_connection(("127.0.0.1", server.port))
        body = json.dumps({"prompt": "wait", "max_new_tokens": 4}).encode()
        sock.sendall(
            f"POST {PREDICT} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        waiters.append(sock)
    while gauge(server, "num_requests_waiting") < waiting:
        time.sleep(0.1)
    cpu_per_refusal = {}
    for size in (10, 100_000, 1_000_000):
        body = json.dumps({"prompt": "x" * size, "max_new_tokens": 4}).encode()
        session = requests.Session()
        n = 200
        cpu0 = cpu_seconds(server)
        for _ in range(n):
            assert (
                session.post(server.url + PREDICT, data=body, timeout=60).status_code == SATURATED
            )
        cpu_per_refusal[f"{size}_chars"] = round((cpu_seconds(server) - cpu0) / n * 1000, 3)
    for h in holders:
        h.close()
    for s in waiters:
        s.close()
    return cpu_per_refusal


def overload(
    server: LocalServer, reference: str, clients: int, seconds: float
) -> tuple[int, int, int, list[float]]:
    """`clients` threads sending the reference request in a loop for `seconds`: answers
    200, of them wrong (not the reference), other errors, and the refusals' latencies."""
    latencies_refused: list[float] = []
    ok = wrong = errors = 0
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client() -> None:
        nonlocal ok, wrong, errors
        session = requests.Session()
        while time.monotonic() < end:
            started = time.monotonic()
            r = session.post(
                server.url + PREDICT, json={"prompt": "reference", "max_new_tokens": 8}, timeout=120
            )
            took = time.monotonic() - started
            with lock:
                if r.status_code == SATURATED:
                    latencies_refused.append(took)
                elif r.status_code == 200:
                    ok += 1
                    wrong += r.json()["output"] != reference
                else:
                    errors += 1
            if r.status_code == SATURATED:
                time.sleep(0.05)

    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(client)
    return ok, wrong, errors, latencies_refused


def phase_sigterm(context: Path, grace: float = 10.0, n: int = 64) -> dict:
    server = start(context, drain_grace_seconds=grace, max_inflight=n)
    responses = [stream(server.url, 100_000, f"s{i}") for i in range(n)]
    readers = [r.iter_content(chunk_size=None) for r in responses]
    for reader in readers:
        next(reader)
    sent = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    cut_after: list[float] = []
    completed = 0

    def drain(reader) -> None:
        nonlocal completed
        try:
            for _ in reader:
                pass
            completed += 1
        except requests.exceptions.RequestException:
            cut_after.append(time.monotonic() - sent)

    threads = [threading.Thread(target=drain, args=(r,)) for r in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(grace + 120)
    status = server.process.wait(120)
    return {
        "streams": n,
        "grace_s": grace,
        "cut_visibly": len(cut_after),
        "completed_cleanly": completed,
        "last_cut_after_s": round(max(cut_after), 2) if cut_after else None,
        "exit_status": status,
    }


def phase_poison(context: Path) -> dict:
    server = start(context)
    body = {"prompt": "Tell me a story", "max_new_tokens": 64, "streaming": True}

    def text() -> bytes:
        with requests.post(server.url + PREDICT, json=body, stream=True, timeout=300) as r:
            return b"".join(r.iter_content(chunk_size=None))

    clean = text()
    poison = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "temperature": 1e-300,
    }
    with ThreadPoolExecutor(12) as pool:
        streams = [pool.submit(text) for _ in range(8)]
        poisoned = [
            pool.submit(
                requests.post, server.url + "/v1/chat/completions", json=poison, timeout=300
            )
            for _ in range(4)
        ]
        statuses = [f.result().status_code for f in poisoned]
        same = sum(f.result() == clean for f in streams)
    alive = requests.get(server.url + "/health", timeout=30).status_code == 200
    server.stop()
    return {
        "streams": 8,
        "identical_to_clean": same,
        "poison_statuses": statuses,
        "alive_after": alive,
    }


def _flood(port: int, pieces: list[bytes]) -> bytes:
    """Send pieces until the server answers or closes; what it answered."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(30)
    try:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        for piece in pieces:
            sock.sendall(piece)
    except OSError:
        pass  # refused mid-flood: the answer is waiting
    try:
        return sock.recv(200)
    except OSError:
        return b""
    finally:
        sock.close()


def _probe_ms(url: str, path: str = "/health") -> float | None:
    """One probe's latency in ms, or None when it failed (3 s: the kubelet's timeout)."""
    started = time.monotonic()
    try:
        ok = requests.get(url + path, timeout=3).status_code == 200
    except requests.RequestException:
        ok = False
    return (time.monotonic() - started) * 1000 if ok else None


def _probing(url: str, stop: threading.Event, out: list) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            out.append(_probe_ms(url))
            time.sleep(0.5)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _probe_figures(samples: list) -> dict:
    ok = [s for s in samples if s is not None]
    return {
        "probes": len(samples),
        "probes_failed": len(samples) - len(ok),
        "probe_ms_p50": round(percentile(ok, 50), 1) if ok else None,
        "probe_ms_max": round(max(ok), 1) if ok else None,
    }


def phase_header_floods(context: Path, clients: int = 20) -> dict:
    result = {}
    lines = [b"X-Flood: " + b"a" * 1000 + b"\r\n"] * 2000  # 2 MB
    pieces = [b"X-Big: "] + [b"v" * 64] * 32000  # one 2 MB value, 64 bytes at a time
    for parser in ("httptools",):  # the server's only parser
        server = start(context)
        rss_before, cpu_before = rss_mb(server), cpu_seconds(server)
        stop, probes = threading.Event(), []
        prober = _probing(server.url, stop, probes)
        started = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            answers = list(
                pool.map(
                    lambda i, port=server.port: _flood(port, lines if i % 2 else pieces),
                    range(clients),
                )
            )
        seconds = time.monotonic() - started
        stop.set()
        prober.join()
        result[parser] = {
            "connections": clients,
            "answered_431": sum(a.startswith(b"HTTP/1.1 431") for a in answers),
            "other_answers": sorted(
                {a[:12].decode("latin-1") for a in answers if not a.startswith(b"HTTP/1.1 431")}
            ),
            "seconds": round(seconds, 2),
            "server_cpu_s": round(cpu_seconds(server) - cpu_before, 2),
            "rss_mb_before": round(rss_before),
            "rss_mb_after": round(rss_mb(server)),
            **_probe_figures(probes),
        }
        server.stop()
    return result


def phase_slowloris(
    context: Path, drippers: int = 300, idle: int = 100, seconds: float = 60
) -> dict:
    server = start(context)  # default timeouts: header 10 s, keep-alive 5 s
    socks = []
    for i in range(drippers + idle):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.setblocking(False)
        if i < drippers:
            sock.send(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(sock)
    stop, probes = threading.Event(), []
    prober = _probing(server.url, stop, probes)
    deadline = time.monotonic() + seconds
    closed_at: dict[int, float] = {}
    started = time.monotonic()
    while time.monotonic() < deadline and len(closed_at) < len(socks):
        for i, sock in enumerate(socks):
            if i in closed_at:
                continue
            try:
                if i < drippers:
                    sock.send(b"z")
                data = sock.recv(4096)
                if not data or data.startswith(b"HTTP/1.1 408"):
                    closed_at[i] = time.monotonic() - started
            except BlockingIOError:
                pass
            except OSError:
                closed_at[i] = time.monotonic() - started
        time.sleep(1.0)
    stop.set()
    prober.join()
    for sock in socks:
        sock.close()
    dripper_times = [t for i, t in closed_at.items() if i < drippers]
    idle_times = [t for i, t in closed_at.items() if i >= drippers]
    result = {
        "drippers": drippers,
        "idle": idle,
        "drippers_closed": len(dripper_times),
        "idle_closed": len(idle_times),
        "dripper_closed_s_max": round(max(dripper_times), 1) if dripper_times else None,
        "idle_closed_s_max": round(max(idle_times), 1) if idle_times else None,
        **_probe_figures(probes),
    }
    server.stop()
    return result


def phase_slow_readers(
    context: Path, buffer_bytes: int, readers: int = 40, inflight: int = 4
) -> dict:
    server = start(
        context, max_inflight=inflight, max_waiting=readers, stream_buffer_bytes=buffer_bytes
    )
    rss_before = rss_mb(server)
    body = json.dumps(
        {"prompt": "Hello", "max_tokens": 3000, "ignore_eos": True, "logprobs": 5, "stream": True}
    ).encode()
    socks = []
    for _ in range(readers):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body) + body
        )
        socks.append(sock)
    started = time.monotonic()
    served_after = None
    rss_peak = rss_before
    while time.monotonic() - started < 300:
        rss_peak = max(rss_peak, rss_mb(server))
        try:
            r = requests.post(
                server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=30
            )
            if r.status_code == 200:
                served_after = time.monotonic() - started
                break
        except requests.RequestException:
            pass
        time.sleep(1.0)
    samples = scrape(server.url)
    aborted = samples.get(
        (
            "mtt:request_finished_total",
            (("finished_reason", "slow_reader"), ("route", "completions")),
        ),
        0.0,
    )
    for sock in socks:
        sock.close()
    result = {
        "readers": readers,
        "max_inflight": inflight,
        "stream_buffer_bytes": buffer_bytes,
        "aborted_slow_reader": aborted,
        "other_client_served_after_s": None if served_after is None else round(served_after, 1),
        "rss_mb_before": round(rss_before),
        "rss_mb_peak": round(rss_peak),
    }
    server.stop()
    return result


def _chat_with_schema(url: str, schema: dict) -> requests.Response:
    return requests.post(
        url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 8,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": schema},
            },
        },
        timeout=600,
    )


SCHEMA_BOMBS = {
    "nested_quantifiers": {"type": "string", "pattern": "((a{0,30}){0,30}){0,30}"},
    "enum_700kb": {"enum": [f"value-{i:07d}-" + "x" * 50 for i in range(11_000)]},
    "deep_nesting": {"type": "object", "properties": {}},
}
_deep = SCHEMA_BOMBS["deep_nesting"]
for _ in range(40):
    _deep["properties"]["a"] = {"type": "object", "properties": {}}
    _deep = _deep["properties"]["a"]


def phase_schema_bombs(context: Path, rounds: int = 5) -> dict:
    """Schema bombs at the default limits (refused before any compile), then with the
    pattern bound lifted so the bomb reaches the timed compile in its child process."""
    result: dict = {}
    for label, settings in (
        ("default_limits", {}),
        ("pattern_bound_lifted", {"grammar_max_pattern_repeat": 10**6,
                                  "grammar_compile_timeout_seconds": 5}),
    ):  # fmt: skip
        server = start(context, **settings)
        stop, probes = threading.Event(), []
        prober = _probing(server.url, stop, probes)
        statuses: dict[str, list[int]] = {}
        bystanders = []
        with ThreadPoolExecutor(4) as pool:
            for _ in range(rounds):
                futures = {
                    n: pool.submit(_chat_with_schema, server.url, b)
                    for n, b in SCHEMA_BOMBS.items()
                }
                bystander = pool.submit(
                    requests.post,
                    server.url + PREDICT,
                    json={"prompt": "hi", "max_new_tokens": 4},
                    timeout=600,
                )
                for name, f in futures.items():
                    statuses.setdefault(name, []).append(f.result().status_code)
                bystanders.append(bystander.result().status_code)
        stop.set()
        prober.join()
        samples = scrape(server.url)
        result[label] = {
            "statuses": {n: sorted(set(v)) for n, v in statuses.items()},
            "bystanders_200": sum(b == 200 for b in bystanders),
            "bystanders": len(bystanders),
            "compile_kills": samples.get(("mtt:grammar_compile_kills_total", ()), 0.0),
            "rss_mb": round(rss_mb(server)),
            **_probe_figures(probes),
        }
        server.stop()
    return result


def phase_echo_prefill(context: Path, short: int = 16, echo_tokens: int = 2000) -> dict:
    """lm-eval-style echo+logprobs of a long prompt among short chat streams: RSS peak,
    bystanders answered, the echo answered."""
    server = start(context)
    rss_before, rss_peak = rss_mb(server), rss_mb(server)
    done = threading.Event()

    def watch() -> None:
        nonlocal rss_peak
        while not done.is_set():
            rss_peak = max(rss_peak, rss_mb(server))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    echo = {
        "prompt": list(range(100, 100 + echo_tokens)),
        "max_tokens": 0,
        "echo": True,
        "logprobs": 1,
    }
    with ThreadPoolExecutor(short + 1) as pool:
        shorts = [
            pool.submit(requests.post, server.url + PREDICT,
                        json={"prompt": f"short {i}", "max_new_tokens": 16}, timeout=600)
            for i in range(short)
        ]  # fmt: skip
        long = pool.submit(requests.post, server.url + "/v1/completions", json=echo, timeout=600)
        codes = [f.result().status_code for f in shorts]
        echo_answer = long.result()
    done.set()
    watcher.join()
    lps = echo_answer.json()["choices"][0]["logprobs"]["token_logprobs"] if echo_answer.ok else []
    result = {
        "short_requests": short,
        "short_200": sum(c == 200 for c in codes),
        "echo_status": echo_answer.status_code,
        "echo_prompt_logprobs": len(lps),
        "rss_mb_before": round(rss_before),
        "rss_mb_peak": round(rss_peak),
        "healthy_after": requests.get(server.url + "/health", timeout=10).status_code,
    }
    server.stop()
    return result


def _quietly(call, *args, **kwargs) -> None:
    """A request whose connection the exiting server may drop (that is the point)."""
    with contextlib.suppress(requests.RequestException):
        call(*args, **kwargs)


def phase_stopped_engine(context: Path, unready_s: float = 3, exit_s: float = 12) -> dict:
    """engine_process=on, its worker SIGSTOPped with a request pending: when readiness
    turns 503 and when the server exits, with what status and last line."""
    server = start(context, engine_process="on", engine_stall_unready_seconds=unready_s,
                   engine_stall_exit_seconds=exit_s)  # fmt: skip
    (worker,) = engine_processes(server.process.pid)
    os.kill(worker, signal.SIGSTOP)
    stopped = time.monotonic()
    pending = threading.Thread(
        target=lambda: _quietly(
            requests.post,
            server.url + PREDICT,
            json={"prompt": "x", "max_new_tokens": 8},
            timeout=120,
        ),
        daemon=True,
    )
    pending.start()
    unready_after = None
    while time.monotonic() - stopped < exit_s + 30 and server.process.poll() is None:
        try:
            code = requests.get(server.url + "/v1/models/model", timeout=3).status_code
        except requests.RequestException:
            code = None
        if code == 503 and unready_after is None:
            unready_after = time.monotonic() - stopped
        time.sleep(0.25)
    exited_after = time.monotonic() - stopped if server.process.poll() is not None else None
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker, signal.SIGKILL)
    last = [ln for ln in server.log().splitlines() if ln.strip()][-1:] or [""]
    result = {
        "engine_stall_unready_seconds": unready_s,
        "engine_stall_exit_seconds": exit_s,
        "readiness_503_after_s": None if unready_after is None else round(unready_after, 1),
        "exited_after_s": None if exited_after is None else round(exited_after, 1),
        "exit_status": server.process.poll(),
        "last_log_line": last[0][-200:],
    }
    server.kill()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--overload-seconds", type=float, default=120.0)
    parser.add_argument("--fuzz", type=int, default=300, help="random bodies on top of the battery")
    parser.add_argument(
        "--slow-reader-buffer",
        type=int,
        default=256 * 2**10,
        help="stream_buffer_bytes for the slow-reader phase (the default setting's value)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.json")
    parser.add_argument(
        "--phases",
        default="bad_input,disconnects,overload,sigterm,poison,header_floods,slowloris,slow_readers,"
        "schema_bombs,echo_prefill,stopped_engine",
        help="comma-separated subset of the phases to run",
    )
    args = parser.parse_args()
    build_dev_model()
    context = render_build_context(Path(tempfile.mkdtemp()) / "context")
    prepare_app_dir(context)
    load_before = os.getloadavg()
    results = {"host": {"cpus": os.cpu_count(), "loadavg_before": load_before}}
    for name, run in (
        ("bad_input", lambda: phase_bad_input(context, args.fuzz)),
        ("disconnects", lambda: phase_disconnects(context)),
        ("overload", lambda: phase_overload(context, args.overload_seconds)),
        ("sigterm", lambda: phase_sigterm(context)),
        ("poison", lambda: phase_poison(context)),
        ("header_floods", lambda: phase_header_floods(context)),
        ("slowloris", lambda: phase_slowloris(context)),
        ("slow_readers", lambda: phase_slow_readers(context, args.slow_reader_buffer)),
        ("schema_bombs", lambda: phase_schema_bombs(context)),
        ("echo_prefill", lambda: phase_echo_prefill(context)),
        ("stopped_engine", lambda: phase_stopped_engine(context)),
    ):
        if name not in args.phases.split(","):
            continue
        started = time.monotonic()
        results[name] = run()
        results[name]["phase_seconds"] = round(time.monotonic() - started, 1)
        print(name, json.dumps(results[name]), flush=True)
    results["host"]["loadavg_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
