"""What the engine-process codec costs per message: the typed msgspec messages
(`engines/process/ipc.py`) against the pickled tuples they replaced, on the same payloads,
for both halves of each message's trip (the engine process builds and encodes it, the
server decodes it and builds what the streams take). Figures, not a test.

    .venv/bin/python bench/ipc_codec.py [--repeat 7] [--json OUT]

Payloads: a Step of N events (one new token each, as a decode step of N running requests
sends; and with logprobs, top 5, as `logprobs: 5` asks), and an Add (what `generate`
sends). Each figure is the median over `--repeat` runs of the mean over many calls.
"decode" builds what the streams take (TokenDelta and TokenLogprob objects, the same
for both codecs); "bare decode" is the codec alone (bytes to tuples or Structs).
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "mistral-trt-truss" / "packages"))

from mistral_gpu_fallback.process import ipc  # noqa: E402
from mistral_serving.engines.base import (  # noqa: E402
    EngineError,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
    TokenDelta,
    TokenLogprob,
)

# ---- the codec this replaced (worker.py before: pickled tuples), kept here to compare ----


def _old_lp_tuples(lps: list[TokenLogprob] | None) -> list[tuple[object, ...]] | None:
    return None if lps is None else [(p.token_id, p.logprob, p.top) for p in lps]


def old_step_encode(deltas: list[tuple[int, TokenDelta]]) -> bytes:
    events = [
        (
            key,
            d.token_ids,
            d.finish_reason,
            _old_lp_tuples(d.logprobs),
            None,
            _old_lp_tuples(d.prompt_logprobs),
        )
        for key, d in deltas
    ]
    return pickle.dumps(("step", events, 0.25, len(events)), protocol=pickle.HIGHEST_PROTOCOL)


def _old_lps(tuples: list[tuple[object, ...]] | None) -> list[TokenLogprob] | None:
    return None if tuples is None else [TokenLogprob(*lp) for lp in tuples]  # type: ignore[arg-type]


def old_step_decode(data: bytes) -> list[object]:
    _, events, _, _ = pickle.loads(data)  # noqa: S301 - the replaced codec, measured
    items: list[object] = []
    for _key, token_ids, reason, logprobs, error, prompt_lps in events:
        if error is not None:
            kind, text = error
            items.append(EngineRequestError(text) if kind == "request" else EngineError(text))
        elif logprobs is None and prompt_lps is None:
            items.append(TokenDelta(token_ids, reason))
        else:
            items.append(TokenDelta(token_ids, reason, _old_lps(logprobs), _old_lps(prompt_lps)))
    return items


# ---- the typed codec ----


def new_step_encode(deltas: list[tuple[int, TokenDelta]]) -> bytes:
    events = [ipc.delta_event(key, d) for key, d in deltas]
    return ipc.encode(ipc.Step(events, 0.25, len(events)))


def new_step_decode(data: bytes) -> list[object]:
    step = ipc.decode_from_engine(data)
    assert isinstance(step, ipc.Step)
    return [ipc.event_item(e) for e in step.events]


# ---- payloads ----


def step_deltas(n: int, top: int | None) -> list[tuple[int, TokenDelta]]:
    def lps(token: int) -> list[TokenLogprob] | None:
        if top is None:
            return None
        return [TokenLogprob(token, -0.5, tuple((token + j, -0.5 - j) for j in range(top)))]

    return [(key, TokenDelta([1000 + key], None, lps(1000 + key))) for key in range(n)]


ADD_SAMPLING = SamplingOptions(
    max_new_tokens=128,
    temperature=0.7,
    top_p=0.9,
    seed=1234,
    stop_token_ids=(2,),
    guided=GuidedDecoding("json_object"),
)
PROMPT = list(range(1, 129))  # a 128-token prompt


def old_add(key: int) -> bytes:
    message = ("add", key, f"req-{key}", list(PROMPT), ADD_SAMPLING)
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def old_add_decode(data: bytes) -> object:
    return pickle.loads(data)  # noqa: S301 - the replaced codec, measured


def new_add(key: int) -> bytes:
    return ipc.encode(ipc.Add(key, f"req-{key}", list(PROMPT), ADD_SAMPLING))


# The decoder alone (bytes -> messages), without building what the streams take.
BARE: dict[Callable[[bytes], object], Callable[[bytes], object]] = {
    new_step_decode: ipc.decode_from_engine,
    ipc.decode_to_engine: ipc.decode_to_engine,
}

# ---- timing ----


def per_call_us(fn: Callable[[], object], repeat: int) -> float:
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    runs = timer.repeat(repeat=repeat, number=number)
    return statistics.median(runs) / number * 1e6


# A message measured: its label, then the old codec's encode and decode, then the new one's.
Case = tuple[
    str,
    Callable[[], bytes],
    Callable[[bytes], object],
    Callable[[], bytes],
    Callable[[bytes], object],
]


def cases() -> list[Case]:
    """Steps of 1, 32 and 256 events (with and without top-5 logprobs), and an add."""
    found: list[Case] = []
    for n in (1, 32, 256):
        for top in (None, 5):
            deltas = step_deltas(n, top)
            label = f"step {n:>3} events" + (", logprobs top 5" if top else "")
            found.append(
                (
                    label,
                    lambda d=deltas: old_step_encode(d),
                    old_step_decode,
                    lambda d=deltas: new_step_encode(d),
                    new_step_decode,
                )
            )
    found.append(
        (
            "add, 128-token prompt",
            lambda: old_add(7),
            old_add_decode,
            lambda: new_add(7),
            ipc.decode_to_engine,
        )
    )
    return found


def time_case(case: Case, repeat: int) -> list[dict[str, object]]:
    """One message through both codecs: a printed line and a row each."""
    label, old_enc, old_dec, new_enc, new_dec = case
    rows: list[dict[str, object]] = []
    old_data, new_data = old_enc(), new_enc()
    assert new_dec(new_data) is not None and old_dec(old_data) is not None
    for codec, enc, dec, bare, data in (
        ("pickle", old_enc, old_dec, pickle.loads, old_data),
        ("msgspec", new_enc, new_dec, BARE[new_dec], new_data),
    ):
        e = per_call_us(enc, repeat)
        d = per_call_us(lambda dec=dec, data=data: dec(data), repeat)
        b = per_call_us(lambda bare=bare, data=data: bare(data), repeat)
        rows.append(
            {
                "message": label,
                "codec": codec,
                "bytes": len(data),
                "encode_us": e,
                "decode_us": d,
                "bare_decode_us": b,
            }
        )
        print(
            f"{label:<32} {codec:<8} {len(data):>7} {e:>10.2f} {d:>10.2f} {e + d:>9.2f} {b:>15.2f}"
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    rows: list[dict[str, object]] = []
    measured = cases()
    print(f"python {sys.version.split()[0]}, pickle protocol {pickle.HIGHEST_PROTOCOL}")
    header = (
        f"{'message':<32} {'codec':<8} {'bytes':>7} {'encode us':>10} {'decode us':>10} "
        f"{'total us':>9} {'bare decode us':>15}"
    )
    print(header)
    for case in measured:
        rows += time_case(case, args.repeat)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
