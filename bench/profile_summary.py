"""Text summary of `bash bench/run_gpu.sh profile`'s output, $OUT/profile (the
docs/perf/*-profile.txt files).

Reads the py-spy speedscope file recorded with `--threads --idle` (samples in time order, one
list per thread, 1/rate s apart), the results rows and the server's request log, and prints:
the figures, the per-wave arrival and first-token times from the request log, a timeline of
the event loop and the engine thread, stops where both threads sit on one line, the engine's
prefill calls, and the event loop's top functions during the ramp and during steady decode.

    python bench/profile_summary.py OUT_DIR [--rate 200] > docs/perf/runN-profile.txt
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import re
from collections import Counter
from pathlib import Path

IDLE_LOOP = "EpollSelector.select"
IDLE_ENGINE = "Condition.wait"


def q(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[int(p * (len(ordered) - 1))]


def figures(rows: list[dict]) -> list[str]:
    eng = {r["per_worker"]: r for r in rows if r.get("figure") == "engine"}
    out = [
        "| run | requests/worker | tok/s | vs engine | TTFT p50 client | TTFT mean server | "
        "queue mean server | TPOT p50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("figure") not in ("service", "engine"):
            continue
        base = eng.get(r["per_worker"])
        ratio = f"{100 * r['output_tok_s'] / base['output_tok_s']:.1f}%" if base else "-"
        ttft = r.get("time_to_first_token_seconds_mean")
        queue = r.get("request_queue_time_seconds_mean")
        out.append(
            f"| {r.get('label', 'engine alone')} | {r['per_worker']} | {r['output_tok_s']:,.1f} "
            f"| {ratio if r['figure'] == 'service' else '-'} | {r['ttft_ms_p50']:.0f} ms "
            f"| {'-' if ttft is None else f'{ttft * 1000:.0f} ms'} "
            f"| {'-' if queue is None else f'{queue * 1000:.1f} ms'} | {r['tpot_ms_p50']:.1f} ms |"
        )
    return out


def waves(log: Path, concurrency: int) -> list[str]:
    """Arrival (finish - duration) and first-token times of each run's first two rounds."""
    rows = []
    with gzip.open(log, "rt") if log.suffix == ".gz" else open(log) as f:
        for line in f:
            if '"ttft_s"' not in line:
                continue
            d = json.loads(line)
            if d["output_tokens"] <= 4 or d["ttft_s"] is None:  # the warm-up asks for 4
                continue
            end = datetime.datetime.strptime(d["asctime"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            rows.append((end - d["duration_s"], d["ttft_s"], end))
    rows.sort()
    runs, cur = [], [rows[0]]
    for r in rows[1:]:  # a new run: an arrival after every earlier request had ended
        if r[0] > max(x[2] for x in cur) + 0.2:
            runs.append(cur)
            cur = [r]
        else:
            cur.append(r)
    runs.append(cur)
    out = []
    for i, run in enumerate(runs):
        a0 = run[0][0]
        for name, w in (
            ("round 1", run[:concurrency]),
            ("round 2", run[concurrency : 2 * concurrency]),
        ):
            if not w:
                continue
            arr = [r[0] - a0 for r in w]
            first = [r[0] + r[1] - a0 for r in w]
            out.append(
                f"run {i + 1} ({len(run)} requests) {name}: arrivals {min(arr):.3f}-{max(arr):.3f} s, "
                f"first tokens {min(first):.3f}-{max(first):.3f} s, server TTFT p50 "
                f"{q([r[1] for r in w], 0.5) * 1000:.0f} ms, p90 {q([r[1] for r in w], 0.9) * 1000:.0f} ms"
            )
    return out


class Profile:
    def __init__(self, path: Path, rate: int) -> None:
        d = json.loads(path.read_text())
        self.frames = d["shared"]["frames"]
        self.rate = rate
        threads = {p["name"].split('"')[1]: p["samples"] for p in d["profiles"]}
        self.loop = threads["MainThread"]
        self.engine = next(v for k, v in threads.items() if k != "MainThread")

    def name(self, i: int) -> str:
        return self.frames[i]["name"]

    def line(self, stack: list[int]) -> str:
        f = self.frames[stack[-1]] if stack else {"name": "-", "line": 0}
        return f"{f['name']}:{f.get('line')}"

    def where(self, i: int) -> str:
        f = self.frames[i]
        path = f.get("file", "")
        short = path.split("site-packages/")[-1].split("packages/")[-1].split("/app/")[-1]
        return f"{f['name']} ({short})"

    def loop_busy(self, s: list[int]) -> bool:
        return bool(s) and self.name(s[-1]) != IDLE_LOOP

    def engine_state(self, s: list[int]) -> str:
        names = [self.name(i) for i in s]
        if any(n.endswith("._prefill") for n in names):
            return "P"
        if any(n.endswith("._decode") for n in names):
            return "D"
        if names and names[-1] == IDLE_ENGINE:
            return "."
        return "o"


def summary(args) -> list[str]:
    out_dir = Path(args.dir)
    rows = [json.loads(x) for x in (out_dir / "results.jsonl").read_text().splitlines() if x]
    conc = next((r["concurrency"] for r in rows if r.get("figure") == "service"), 256)
    lines = [
        "# Figures (one device call; client TTFT from `client.metrics`, server means from /metrics)",
        "",
    ]
    lines += figures(rows)
    log = next((p for p in (out_dir / "server.log.gz", out_dir / "server.log") if p.exists()), None)
    if log:
        lines += [
            "",
            "# Rounds (server request log: arrival = end - duration; first token = arrival + ttft_s)",
            "",
        ]
        lines += waves(log, conc)
    prof = Profile(out_dir / args.profile, args.rate)
    dt = 1 / args.rate
    n = min(len(prof.loop), len(prof.engine))
    busy = [prof.loop_busy(s) for s in prof.loop[:n]]
    state = "".join(prof.engine_state(s) for s in prof.engine[:n])
    # Prefill sub-states: W = the engine thread at _prefill's own lines (waiting on the GPU at
    # its host copy), P = inside the forward pass (launching kernels).
    state = "".join(
        "W" if c == "P" and prof.line(s).startswith("StaticTorchEngine._prefill") else c
        for c, s in zip(state, prof.engine[:n])
    )
    lines += timeline(args, n, busy, state)
    lines += stops(prof, n, busy, dt)
    lines += prefill_calls(state, busy, dt)
    for label, a, b in windows(busy, state, n):
        lines += loop_window(prof, label, a, b, dt, args.top)
    gil = out_dir / args.gil
    if gil.exists():
        lines += gil_holders(gil, args.gil, dt)
    return lines


def timeline(args, n: int, busy: list[bool], state: str) -> list[str]:
    """Per 200 ms: the event loop's busy share and the engine thread's states."""
    dt = 1 / args.rate
    lines = [
        "",
        f"# Timeline ({args.profile}: {n} samples per thread, {dt * 1000:.0f} ms apart; 200 ms bins)",
        "",
    ]
    lines.append("t (s) | loop busy | engine: prefill / decode / idle")
    step = int(0.2 * args.rate)
    for i in range(0, n, step):
        seg = state[i : i + step]
        lines.append(
            f"{i * dt:5.1f} | {sum(busy[i : i + step]) / len(seg):4.0%} | "
            f"{(seg.count('P') + seg.count('W')) / len(seg):4.0%} / {seg.count('D') / len(seg):4.0%} / "
            f"{seg.count('.') / len(seg):4.0%}"
        )
    return lines


def stops(prof: Profile, n: int, busy: list[bool], dt: float) -> list[str]:
    """Runs of >= 20 samples where both threads sit on one line while the loop is busy."""
    lines = ["", "# Stops: >= 20 consecutive samples where each thread sits on one line", ""]
    loop_lines = [prof.line(s) for s in prof.loop[:n]]
    eng_lines = [prof.line(s) for s in prof.engine[:n]]
    i = 0
    while i < n:
        j = i
        while j + 1 < n and loop_lines[j + 1] == loop_lines[i] and eng_lines[j + 1] == eng_lines[i]:
            j += 1
        if j - i + 1 >= 20 and busy[i]:
            lines.append(
                f"at {i * dt:.2f} s for {(j - i + 1) * dt * 1000:.0f} ms: loop at {loop_lines[i]}, "
                f"engine at {eng_lines[i]}"
            )
        i = j + 1
    return lines


def prefill_calls(state: str, busy: list[bool], dt: float) -> list[str]:
    """The engine's prefill calls of 3 samples or more: forward pass and GPU wait."""
    lines = [
        "",
        "# Prefill calls (P: in the forward pass, W: waiting for the GPU at the host copy)",
        "",
    ]
    for m in re.finditer("[PW]+", state):
        seg, a = m.group(), m.start()
        if len(seg) >= 3:
            lines.append(
                f"at {a * dt:5.2f} s: {len(seg) * dt * 1000:4.0f} ms (forward {seg.count('P') * dt * 1000:.0f} ms, "
                f"GPU wait {seg.count('W') * dt * 1000:.0f} ms), loop busy {sum(busy[a : a + len(seg)]) / len(seg):.0%}"
            )
    return lines


def windows(busy: list[bool], state: str, n: int) -> tuple[tuple[str, int, int], ...]:
    """The sample windows the event loop's top functions are read in."""
    # Windows: the ramp = the loop's first 10 busy samples in a row .. first run of >= 10 decode samples;
    # steady = that decode run.
    first = re.search("1{10,}", "".join("1" if b else "0" for b in busy))
    t0 = first.start() if first else 0
    m = re.search("D{10,}", state[t0:])
    t1, t2 = (t0 + m.start(), t0 + m.end()) if m else (n, n)
    idle = re.search("0{10,}", "".join("1" if b else "0" for b in busy[t0:]))
    t3 = t0 + idle.start() if idle else t1  # the loop's intake burst ends at its first idle 50 ms
    return (
        ("intake burst (round 1 arrivals, until the loop first idles 50 ms)", t0, t3),
        ("ramp (round 1 arrivals to the first full decode)", t0, t1),
        ("steady decode", t1, t2),
    )


def loop_window(prof: Profile, label: str, a: int, b: int, dt: float, top: int) -> list[str]:
    """The event loop's top functions (self and inclusive) and the engine thread's in the
    window of samples a..b."""
    w = prof.loop[a:b]
    if not w:
        return []
    on = [s for s in w if prof.loop_busy(s)]
    lines = [
        "",
        f"# Event loop, {label}: {a * dt:.2f}-{b * dt:.2f} s, {len(w)} samples, busy {len(on) / len(w):.0%}",
        "",
    ]
    leaf = Counter(f"{prof.line(s)} ({prof.where(s[-1]).split(' (')[-1]}" for s in on)
    inc = Counter()
    for s in on:
        for k in {prof.where(i) for i in s}:
            inc[k] += 1
    lines.append("self (% of the window's samples):")
    lines += [f"  {v / len(w):5.1%}  {k}" for k, v in leaf.most_common(top)]
    lines.append("inclusive (% of the window's samples):")
    lines += [f"  {v / len(w):5.1%}  {k}" for k, v in inc.most_common(top * 3)]
    we = prof.engine[a:b]
    lines.append("engine thread, self:")
    lines += [
        f"  {v / len(we):5.1%}  {k}" for k, v in Counter(prof.line(s) for s in we).most_common(8)
    ]
    return lines


def gil_holders(gil: Path, name: str, dt: float) -> list[str]:
    """py-spy --gil's samples per thread: how long each held the GIL."""
    d = json.loads(gil.read_text())
    lines = [
        "",
        f"# {name} (py-spy --gil: only the GIL holder is sampled; not time-aligned)",
        "",
    ]
    for p in d["profiles"]:
        lines.append(
            f"{p['name']}: {len(p['samples'])} samples ({len(p['samples']) * dt:.2f} s holding the GIL)"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--profile", default="spy-threads.json")
    ap.add_argument("--gil", default="spy-gil.json")
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--top", type=int, default=12)
    print("\n".join(summary(ap.parse_args())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
