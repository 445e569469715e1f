"""bench/burst_ttft.py's summary of a burst: each phase from the client's send to its first
byte, the spread of each instant over the burst, and the engine's admission groups inside
the burst's window (times in seconds in, milliseconds out)."""

from __future__ import annotations

from bench.burst_ttft import match, summarize


def test_a_burst_in_two_admission_groups() -> None:
    client = [
        {"id": "a", "sent": 10.000, "received": 10.030},
        {"id": "b", "sent": 10.002, "received": 10.060},
        {"id": "c", "sent": 10.004, "received": None},  # no text: left out of the TTFT
    ]
    server = [
        {"id": i, "arrived_at": t, "parsed_at": t + 0.001, "admitted_at": t + 0.001,
         "stream_started_at": t + 0.004, "submitted_at": t + 0.004, "first_token_at": f}
        for i, t, f in (("a", 10.005, 10.028), ("b", 10.015, 10.058), ("c", 10.016, 10.058))
    ] + [{"id": "other", "arrived_at": 9.0}]  # fmt: skip
    groups = [
        {"probe": "group", "at": 9.5, "prompts": 3},  # before the burst: not its own
        {"probe": "group", "at": 10.010, "prompts": 1, "seconds": 0.015},
        {"probe": "group", "at": 10.025, "prompts": 2, "seconds": 0.020},
    ]
    rows = match(client, server)
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    got = summarize(rows, groups)
    assert got["requests"] == 3
    assert got["ttft_ms"] == {"p50": 44.0, "max": 58.0}
    assert got["to_arrived_ms"]["max"] == 13.0
    assert got["spread_sent_ms"] == 4.0 and got["spread_submitted_at_ms"] == 11.0
    assert [(g["prompts"], g["at"]) for g in got["engine_groups"]] == [(1, 10.0), (2, 25.0)]
    assert got["engine_groups"][1]["seconds"] == 20.0
