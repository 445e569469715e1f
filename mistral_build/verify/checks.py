"""The checks of what the server answers: models and health, streaming against
non-streaming, stop strings, penalties, concurrency, a long prompt, logprobs. Each takes the
`Context` and returns its detail line, or raises CheckFailed / CheckWarned."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from mistral_build.verify import wire
from mistral_build.verify.config import GREEDY, MAX_INFLIGHT, MAX_NUM_TOKENS, MAX_WAITING
from mistral_build.verify.judges import Tokenize, judge_agreement, judge_logprobs
from mistral_build.verify.results import CheckFailed, CheckWarned


@dataclass
class Context:
    url: str
    expected_engine: str
    model: str = "model"  # served model name, from /v1/models
    max_model_len: int = 0
    concurrency: int = MAX_INFLIGHT
    max_inflight: int = MAX_INFLIGHT
    max_waiting: int = MAX_WAITING
    long_tokens: int = 4000  # a stream that outlasts the checks that hold it
    drain_tokens: int = 512
    max_num_tokens: int = MAX_NUM_TOKENS["pytorch"]  # prompt tokens per engine step
    # Text -> token ids, to compare greedy answers by tokens (the artifact's tokenizer).
    tokenize: Tokenize = field(default=lambda text: list(text.encode()))


def check_health_and_models(ctx: Context) -> str:
    requests = wire._requests()
    health = requests.get(ctx.url + "/health", timeout=10)
    if health.status_code != 200:
        raise CheckFailed(f"/health -> {health.status_code}")
    models = requests.get(ctx.url + "/v1/models", timeout=10)
    if models.status_code != 200:
        raise CheckFailed(f"/v1/models -> {models.status_code}: {models.text[:200]}")
    data = models.json().get("data") or []
    if len(data) != 1 or not data[0].get("id"):
        raise CheckFailed(f"/v1/models lists {data!r}; expected one model")
    ctx.model = data[0]["id"]
    ctx.max_model_len = int(data[0].get("max_model_len") or 0)
    engine = requests.get(ctx.url + "/version", timeout=10).json().get("engine")
    if engine != ctx.expected_engine:
        raise CheckFailed(f"/version says engine {engine!r}, expected {ctx.expected_engine!r}")
    return (
        f"/health 200; /v1/models: {ctx.model} (max_model_len {ctx.max_model_len}); engine {engine}"
    )


def check_streaming_equals_non_streaming(ctx: Context) -> str:
    """Streamed and non-streamed greedy answers of predict and chat, token-prefix compared."""
    body = {"prompt": "Write about the sea", "max_new_tokens": 48, "streaming_interval": 1}
    body |= GREEDY
    full = wire.predict(ctx.url, **body)
    streamed = wire.predict_stream(ctx.url, **body)
    chat = {
        "model": ctx.model,
        "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
        "max_tokens": 48,
        "temperature": 0,
    }
    message = wire.post_json(ctx.url, "/v1/chat/completions", chat)["choices"][0]["message"]
    joined = wire.chat_stream(ctx.url, chat)
    pairs = [(full["output"], streamed), (message.get("content") or "", joined)]
    return (
        judge_agreement("predict and chat, streamed vs not", pairs, ctx.tokenize)
        + f" ({full['usage']['completion_tokens']} predict tokens)"
    )


def check_stop_strings(ctx: Context) -> str:
    base = {"prompt": "Once upon a time", "max_new_tokens": 48} | GREEDY
    full = wire.predict(ctx.url, **base)["output"]
    if len(full.strip()) < 6:
        raise CheckFailed(f"the greedy answer {full!r} is too short to pick a stop string from")
    mid = len(full) // 2
    stop = full[mid : mid + 3]
    cut = full[: full.index(stop)]
    r = wire.predict(ctx.url, **base, stop=[stop])
    if r["output"] != cut or r["finish_reason"] != "stop":
        raise CheckFailed(
            f"stop={stop!r}: got {r['output']!r} ({r['finish_reason']}), expected {cut!r} (stop)"
        )
    streamed = wire.predict_stream(ctx.url, **base, stop=[stop], streaming_interval=1)
    if streamed != cut:
        raise CheckFailed(f"stop={stop!r} streamed: got {streamed!r}, expected {cut!r}")
    return (
        f"stop={stop!r} ends the output before it ({len(cut)} of {len(full)} chars), streamed too"
    )


def check_penalties(ctx: Context) -> str:
    # A random model repeats itself within ~100 tokens; penalties only count output tokens.
    base = {"prompt": "The the the the the", "max_new_tokens": 160} | GREEDY
    plain = wire.predict(ctx.url, **base)["output"]
    changed = []
    for name in ("presence_penalty", "frequency_penalty"):
        out = wire.predict(ctx.url, **base, **{name: 2.0})["output"]  # CheckFailed unless 200
        changed.append((name, out != plain))
    unchanged = [n for n, c in changed if not c]
    if unchanged:
        raise CheckFailed(
            f"accepted, but {' and '.join(unchanged)}=2.0 left the greedy output unchanged "
            "(the engine ignores it)"
        )
    return "presence_penalty=2.0 and frequency_penalty=2.0 each change the greedy output"


def together(ctx: Context, prompts: list[str], body: dict[str, Any], stream: bool) -> list[str]:
    """Greedy answers to `prompts`, all sent at once (one batch), streamed or not."""
    send = wire.predict_stream if stream else lambda url, **b: wire.predict(url, **b)["output"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: send(ctx.url, prompt=p, **body), prompts))


def check_concurrency(ctx: Context) -> str:
    """n greedy streams at once against the same n requests non-streamed at once (the same
    batch size), and those against the requests one at a time (early differences only)."""
    n = ctx.concurrency
    prompts = [f"Question number {i}: why is the sky blue?" for i in range(n)]
    body = {"max_new_tokens": 32, "streaming_interval": 1} | GREEDY
    sequential = [wire.predict(ctx.url, prompt=p, **body)["output"] for p in prompts]
    plain = together(ctx, prompts, body, stream=False)
    streamed = together(ctx, prompts, body, stream=True)
    pairs = list(zip(plain, streamed, strict=True)) + list(zip(sequential, plain, strict=True))
    return judge_agreement(
        f"{n} concurrent greedy streams vs {n} concurrent non-streamed, and those vs sequential",
        pairs,
        ctx.tokenize,
    )


def check_long_prompt(ctx: Context) -> str:
    """A prompt longer than max_num_tokens (the prompt tokens one engine step takes): only
    chunked prefill serves it. It must be answered, counted right, and the same greedy
    answer twice."""
    target = ctx.max_num_tokens + ctx.max_num_tokens // 2 + 8
    if ctx.max_model_len and target + 16 > ctx.max_model_len:
        raise CheckWarned(
            f"not tested: max_num_tokens {ctx.max_num_tokens} leaves no room under "
            f"max_model_len {ctx.max_model_len}"
        )
    words = "The lighthouse keeper counted the waves again and again. "
    per = max(1, len(ctx.tokenize(words)))
    prompt = words * (target // per + 1)
    body = {"model": ctx.model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    first = wire.post_json(ctx.url, "/v1/completions", body)
    used = first["usage"]["prompt_tokens"]
    if used <= ctx.max_num_tokens:
        raise CheckFailed(
            f"the prompt counted {used} tokens, not more than max_num_tokens "
            f"{ctx.max_num_tokens}: the check did not test chunked prefill"
        )
    if first["usage"]["completion_tokens"] < 1:
        raise CheckFailed(f"a {used}-token prompt got no completion tokens: {first['usage']}")
    again = wire.post_json(ctx.url, "/v1/completions", body)
    pair = [(first["choices"][0]["text"], again["choices"][0]["text"])]
    verdict = judge_agreement("answered twice", pair, ctx.tokenize)
    return f"{used}-token prompt (max_num_tokens {ctx.max_num_tokens}) answered; {verdict}"


def check_logprobs(ctx: Context) -> str:
    """Chat logprobs with top_logprobs 2, then 1, then 0: one entry per generated token, finite
    logprobs <= 0, the top list sorted, and the greedy token the best of it. A clear 4xx
    refusal (a kind or sampler that cannot) passes, with what was refused."""
    notes: list[str] = []
    # 0: the chosen token's logprob only (all a TRTLLMSampler returns: trtllm_sampler=trtllm).
    for k in (2, 1, 0):
        body = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": "Name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": k,
        }
        r = wire._requests().post(ctx.url + "/v1/chat/completions", json=body, timeout=300)
        if 400 <= r.status_code < 500:
            notes.append(f"top_logprobs={k} refused ({r.status_code}: {wire.error_text(r)})")
            continue
        if r.status_code != 200:
            raise CheckFailed(f"logprobs top_logprobs={k} -> {r.status_code}: {r.text[:200]}")
        answer = r.json()
        content = ((answer["choices"][0].get("logprobs") or {}).get("content")) or []
        judge_logprobs(content, answer["usage"]["completion_tokens"], k)
        notes.append(f"top_logprobs={k}: {len(content)} tokens, consistent")
        return "; ".join(notes)
    # Every form refused: a clear answer, nothing to check the values of.
    return "; ".join(notes) + " (this kind returns no logprobs: stated refusals, no 500)"


AnswerCheck = Callable[[Context], str]
ANSWER_CHECKS: list[tuple[str, AnswerCheck]] = [
    ("health_and_models", check_health_and_models),
    ("streaming_equals_non_streaming", check_streaming_equals_non_streaming),
    ("stop_strings", check_stop_strings),
    ("penalties", check_penalties),
    ("concurrency", check_concurrency),
    ("long_prompt", check_long_prompt),
    ("logprobs", check_logprobs),
]
