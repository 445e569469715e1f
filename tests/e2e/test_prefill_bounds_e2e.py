"""One echo + logprobs request of 3,000 prompt tokens beside 16 short requests, through
the real Truss server, with a tiny `prefill_logits_bytes` (8 positions of logits per
projection, 8 rows per prefill) and the server's data segment capped (RLIMIT_DATA, set on
the running server: its size after warm-up plus 800 MB, which the old prefill's
3,000 x 32,000 float32 logits and their two float32 copies, 1.15 GB for the echo request
alone, exceed, and which the chunked prefill stays far within): every bystander gets
exactly the answer it gets alone, the echo request gets exactly its unbatched prompt
logprobs, and the server stays healthy. (That the prefill holds no more than the budget is
also measured in tests/unit/test_prefill_bounds.py, by the lm_head calls.)"""

from __future__ import annotations

import resource
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.e2e

VOCAB = 32000
CHUNK = 8
LOGITS_BYTES = CHUNK * VOCAB * (4 + 12)  # float32 logits + float32 work, per position
ECHO_IDS = [1, *[(i * 7919) % 30000 + 1000 for i in range(2999)]]  # 3,000 tokens
HEADROOM = 800 * 2**20  # bytes of data segment the server may grow by under the cap
SHORT = [f"Bystander {i}: the mistral wind blows" + " and" * (i % 5) for i in range(16)]
TOL = 1e-4


@pytest.fixture(scope="module")
def server(start_server: Callable[..., object]):
    # max_num_tokens 4096: the echo prompt is prefilled in a step of its own (the old
    # admission counted prompt tokens, not padded rows, and would batch it anyway).
    return start_server(prefill_logits_bytes=LOGITS_BYTES, max_num_tokens=4096)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server.url


def data_bytes(pid: int) -> int:
    """The process's data segment (VmData: private writable memory, what RLIMIT_DATA caps)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmData")


def short(url: str, prompt: str) -> dict:
    r = requests.post(
        f"{url}/v1/completions",
        json={"model": "m", "prompt": prompt, "max_tokens": 6, "temperature": 0},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def echo(url: str) -> dict:
    r = requests.post(
        f"{url}/v1/completions",
        json={
            "model": "m",
            "prompt": [ECHO_IDS],
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 2,
            "echo": True,
        },
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_the_server_reports_the_chunk(url: str) -> None:
    details = requests.get(f"{url}/version", timeout=30).json()["details"]
    assert details["prefill_logits_chunk"] == CHUNK


def test_echo_beside_bystanders_under_a_memory_cap(server, url: str) -> None:
    alone = [short(url, p)["choices"][0]["text"] for p in SHORT]
    pid = server.process.pid
    cap = data_bytes(pid) + HEADROOM
    resource.prlimit(pid, resource.RLIMIT_DATA, (cap, cap))
    echo_alone = echo(url)["choices"][0]["logprobs"]
    assert len(echo_alone["token_logprobs"]) == len(ECHO_IDS) + 1  # prompt + the generated

    with ThreadPoolExecutor(len(SHORT) + 1) as pool:
        futures = [pool.submit(short, url, p) for p in SHORT[:8]]
        echo_future = pool.submit(echo, url)
        futures += [pool.submit(short, url, p) for p in SHORT[8:]]
        together = [f.result()["choices"][0]["text"] for f in futures]
        echo_together = echo_future.result()["choices"][0]["logprobs"]

    assert together == alone
    got, want = echo_together["token_logprobs"], echo_alone["token_logprobs"]
    assert len(got) == len(want) and got[0] is None and want[0] is None
    assert all(abs(a - b) < TOL for a, b in zip(got[1:], want[1:]))
    for top_got, top_want in zip(echo_together["top_logprobs"][1:], echo_alone["top_logprobs"][1:]):
        assert top_got.keys() == top_want.keys() or all(
            abs(a - b) < TOL for a, b in zip(sorted(top_got.values()), sorted(top_want.values()))
        )
    # The server is still healthy, and within its cap.
    assert requests.get(f"{url}/health", timeout=30).status_code == 200
    assert data_bytes(pid) <= cap
