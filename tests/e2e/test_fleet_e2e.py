"""The fleet's serving basics on the real Truss server (dev model), in one server: request
traces exported over OTLP/HTTP to a collector on loopback (the caller's traceparent
continued, every phase under the request span), trtllm-serve's metric names, API keys from
the Truss secret, a deadline that ends an answer with a 504 or `finish_reason: "timeout"`,
and the endpoint picker's headers accepted."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

pytestmark = pytest.mark.e2e

KEY = "sk-fleet-secret-0123456789"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
WAIT_S = 90  # a bound on waiting for the exporter's batch, never a speed assertion


class Collector:
    """An OTLP/HTTP trace receiver on loopback: what the server's exporter posts."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest()
                request.ParseFromString(data)
                with outer.lock:
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            outer.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def trace(self, trace_id: str) -> list[Any]:
        with self.lock:
            return [s for s in self.spans if s.trace_id.hex() == trace_id]


@pytest.fixture(scope="module")
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


@pytest.fixture(scope="module")
def fleet(start_server: Callable[..., Any], collector: Collector) -> Any:
    return start_server(
        extra_env={"TRUSS_SECRET_api_keys": f"# rotated\n{KEY}\n"},
        otlp_traces_endpoint=collector.url,
        metrics_names="trtllm",
    )


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


def test_the_secrets_key_is_required_and_the_sdk_works_with_it(fleet: Any) -> None:
    r = requests.post(f"{fleet.url}/v1/models/model:predict", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    sdk = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key=KEY, max_retries=0)
    answer = sdk.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert KEY not in fleet.log()


def test_a_request_is_traced_under_the_callers_trace(fleet: Any, collector: Collector) -> None:
    headers = auth() | {
        "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01",
        "X-Request-Id": "traced-request",
    }
    r = requests.post(
        f"{fleet.url}/v1/completions",
        json={"model": "m", "prompt": "Hi", "max_tokens": 4, "stream": True},
        headers=headers,
        timeout=60,
    )
    assert r.status_code == 200 and "data: [DONE]" in r.text
    end = time.monotonic() + WAIT_S
    while len(collector.trace(TRACE_ID)) < 7:  # the batch is exported within seconds
        assert time.monotonic() < end, [s.name for s in collector.trace(TRACE_ID)]
        time.sleep(0.2)
    spans = {s.name: s for s in collector.trace(TRACE_ID)}
    assert set(spans) >= {"request", "parse", "queue", "tokenize", "prefill", "decode", "stream"}
    root = spans["request"]
    assert root.parent_span_id.hex() == PARENT_ID
    attributes = {a.key: a.value.string_value for a in root.attributes}
    assert attributes["request.id"] == "traced-request"
    for name in ("parse", "queue", "tokenize", "prefill", "decode", "stream"):
        assert spans[name].parent_span_id == root.span_id, name


def test_metrics_carry_trtllm_serves_names(fleet: Any) -> None:
    text = requests.get(f"{fleet.url}/metrics", timeout=30).text
    for name in (
        "trtllm_num_requests_waiting",
        "trtllm_num_requests_running",
        "trtllm_kv_cache_utilization",
    ):
        assert f"# TYPE {name} gauge" in text, name
    assert "mtt:" not in text and "vllm:" not in text
    # the PyTorch engine has no block reuse: no cache figures, rather than zeros
    assert "trtllm_kv_cache_reused_blocks" not in text


def test_a_deadline_ends_the_answer_visibly(fleet: Any) -> None:
    body = {"model": "m", "prompt": "Hi", "max_tokens": 400, "ignore_eos": True}
    timeout = {"X-Request-Timeout": "0.05"}
    r = requests.post(
        f"{fleet.url}/v1/completions", json=body, headers=auth() | timeout, timeout=60
    )
    assert r.status_code == 504, r.text
    assert "deadline passed" in r.json()["error"]["message"]
    streamed = requests.post(
        f"{fleet.url}/v1/completions",
        json=body | {"stream": True},
        headers=auth() | {"X-Request-Timeout": "0.3"},
        timeout=60,
    )
    # Either before the answer began (504) or in-band: never a complete success.
    if streamed.status_code == 200:
        assert '"finish_reason":"timeout"' in streamed.text.replace(" ", "")
        assert streamed.text.rstrip().endswith("data: [DONE]")
    else:
        assert streamed.status_code == 504
    bad = requests.post(
        f"{fleet.url}/v1/completions",
        json=body,
        headers=auth() | {"X-Request-Timeout": "whenever"},
        timeout=60,
    )
    assert bad.status_code == 400 and "X-Request-Timeout" in bad.json()["error"]["message"]


def test_the_pickers_headers_are_accepted(fleet: Any) -> None:
    headers = auth() | {
        "x-request-id": "picked-1",
        "x-gateway-destination-endpoint": "127.0.0.1:8080",
        "x-gateway-inference-objective": "chat",
        "x-gateway-inference-fairness-id": "team-a",
        "x-gateway-model-name-rewrite": "mistral",
        "x-envoy-expected-rq-timeout-ms": "60000",
    }
    for path, body in (
        ("/v1/models/model:predict", {"prompt": "Hi", "max_new_tokens": 2}),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
        ),
    ):
        r = requests.post(fleet.url + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 200, (path, r.text)
        assert r.headers["x-request-id"] == "picked-1"
