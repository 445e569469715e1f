"""The PyTorch engine in its own process (`engines/process/client.py` + `engines/process/worker.py`) on
the dev model (CPU): the same tokens, logprobs and structured output as the in-process
engine; abort, per-request errors, a killed child, shutdown and start-up failures."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import time
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mistral_gpu_fallback.process.client import ProcessEngine, wants_own_process
from mistral_serving.artifacts.artifact import open_artifact
from mistral_serving.engines.base import (
    EngineError,
    EngineRequestError,
    GuidedDecoding,
    SamplingOptions,
)
from mistral_serving.engines.factory import start_engine, start_guided_torch_engine
from mistral_serving.settings import Settings, SettingsError
from mistral_serving.text.detokenizer import IncrementalDetokenizer

PROMPTS = [[1] + list(range(100 + 37 * i, 100 + 37 * i + 2 + 5 * i)) for i in range(6)]
GREEDY = SamplingOptions(max_new_tokens=16, top_k=1)
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "ok": {"type": "boolean"}},
    "required": ["answer", "ok"],
    "additionalProperties": False,
}
DEADLINE_S = 60  # a bound on waiting for a condition, never a speed assertion


def settings_for(dev_model: Path, **values) -> Settings:
    return Settings(artifact=str(dev_model), device="cpu", **values)


@pytest.fixture(scope="module")
def proc_engine(dev_model: Path, tok):
    """Through the factory, as the server starts it with engine_process=on."""
    s = settings_for(dev_model, engine_process="on")
    eng = start_engine(open_artifact(dev_model, s), s, tok)
    assert isinstance(eng, ProcessEngine)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def local_engine(dev_model: Path, tok):
    eng = start_guided_torch_engine(dev_model, settings_for(dev_model), tok)
    yield eng
    eng.shutdown()


async def collect(engine, rid, prompt, opts, delay=0.0):
    await asyncio.sleep(delay)
    deltas = []
    async for delta in engine.generate(rid, prompt, opts):
        deltas.append(delta)
    return deltas


def run_batch(engine, opts: SamplingOptions) -> list:
    async def main():
        return await asyncio.gather(
            *[collect(engine, f"r{i}", p, opts, 0.003 * i) for i, p in enumerate(PROMPTS)]
        )

    return asyncio.run(main())


def tokens_of(deltas) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def stream_of(deltas) -> tuple:
    """What a stream says, however its deltas were grouped: read_stream merges the deltas
    of a consumer that fell behind, which a busy machine decides, not the engine."""
    logprobs = [lp for d in deltas for lp in d.logprobs or ()]
    prompt_logprobs = [lp for d in deltas for lp in d.prompt_logprobs or ()]
    reasons = [d.finish_reason for d in deltas if d.finish_reason is not None]
    return tokens_of(deltas), logprobs, prompt_logprobs, reasons


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_start_up_carries_limits_eos_and_info(proc_engine, local_engine):
    assert proc_engine.limits == local_engine.limits
    assert proc_engine.eos_token_id == local_engine.eos_token_id
    assert proc_engine.vocab_size == local_engine.vocab_size
    assert proc_engine.info.name == local_engine.info.name
    assert proc_engine.info.details["engine_process"] == proc_engine.pid != os.getpid()
    assert proc_engine.is_healthy()


def test_concurrent_greedy_output_equals_the_in_process_engine(proc_engine, local_engine):
    ours, theirs = run_batch(proc_engine, GREEDY), run_batch(local_engine, GREEDY)
    for a, b in zip(ours, theirs):
        assert tokens_of(a) == tokens_of(b) and len(tokens_of(a)) == 16
        assert [d.finish_reason for d in a][-1] == "length"


@pytest.mark.parametrize("kv_cache", ["static"])
def test_the_static_engine_in_its_own_process_equals_it_in_process(dev_model, tok, kv_cache):
    s = settings_for(dev_model, pytorch_kv_cache=kv_cache, max_seq_len=512)
    local = start_guided_torch_engine(dev_model, s, tok)
    remote = ProcessEngine.start(dev_model, s, tok.eos_id)
    try:
        assert remote.info.details["kv_cache"] == "static"
        ours, theirs = run_batch(remote, GREEDY), run_batch(local, GREEDY)
        assert [tokens_of(d) for d in ours] == [tokens_of(d) for d in theirs]
    finally:
        remote.shutdown()
        local.shutdown()


def test_logprobs_cross_the_process_unchanged(proc_engine, local_engine):
    opts = SamplingOptions(max_new_tokens=6, top_k=1, logprobs=3)
    ours = asyncio.run(collect(proc_engine, "lp", PROMPTS[2], opts))
    theirs = asyncio.run(collect(local_engine, "lp", PROMPTS[2], opts))
    got = [lp for d in ours for lp in d.logprobs]
    want = [lp for d in theirs for lp in d.logprobs]
    assert len(got) == 6 and all(len(lp.top) == 3 for lp in got)
    assert [lp.token_id for lp in got] == [lp.token_id for lp in want] == tokens_of(ours)
    for g, w in zip(got, want):
        assert g.logprob == pytest.approx(w.logprob, abs=1e-5)
        assert [t for t, _ in g.top] == [t for t, _ in w.top]
    assert all(
        d.logprobs is None for d in asyncio.run(collect(proc_engine, "n", PROMPTS[2], GREEDY))
    )


def test_sampled_output_with_a_seed_equals_the_in_process_engine(proc_engine, local_engine):
    opts = SamplingOptions(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7)
    ours = asyncio.run(collect(proc_engine, "s", PROMPTS[1], opts))
    theirs = asyncio.run(collect(local_engine, "s", PROMPTS[1], opts))
    assert tokens_of(ours) == tokens_of(theirs)


def test_response_format_is_decoded_in_the_child(proc_engine, local_engine, tok):
    """The GuidedDecoder lives in the child: the output parses, validates, and is the
    in-process engine's token for token."""
    opts = SamplingOptions(
        max_new_tokens=64, top_k=1, guided=GuidedDecoding("json_schema", json.dumps(SCHEMA))
    )
    ours = asyncio.run(collect(proc_engine, "g", tok.encode("JSON:", bos=True), opts))
    theirs = asyncio.run(collect(local_engine, "g", tok.encode("JSON:", bos=True), opts))
    assert tokens_of(ours) == tokens_of(theirs) and ours[-1].finish_reason == "stop"
    detok = IncrementalDetokenizer(tok.table)
    text = detok.push(tokens_of(ours)) + detok.flush()
    jsonschema.validate(json.loads(text), SCHEMA)


def test_abort_and_a_closed_stream_free_the_request(proc_engine):
    long = SamplingOptions(max_new_tokens=2000, top_k=1)

    async def aborted():
        reasons = []
        async for delta in proc_engine.generate("ab", PROMPTS[0], long):
            reasons.append(delta.finish_reason)
            if len(reasons) == 3:
                proc_engine.abort("ab")
        return reasons

    reasons = asyncio.run(aborted())
    assert reasons[-1] == "abort" and len(reasons) < 2000

    async def closed_early():
        stream = proc_engine.generate("gone", PROMPTS[1], long)
        await stream.__anext__()
        await stream.aclose()  # a client that went away

    asyncio.run(closed_early())
    wait_until(lambda: proc_engine.num_running() == 0, "the engine to drop the request")
    assert proc_engine.kv_cache_usage() == 0.0 and proc_engine.is_healthy()


def test_a_failing_request_fails_alone(proc_engine, local_engine):
    """Refused inputs are the client's error (EngineRequestError), a failure inside the
    engine is EngineError; the concurrent requests finish as they would alone."""
    bad_schema = SamplingOptions(
        max_new_tokens=4, guided=GuidedDecoding("json_schema", '{"type": "nonsense"}')
    )
    bad_seed = SamplingOptions(max_new_tokens=4, seed=2**70)  # torch's generator refuses it

    async def main():
        return await asyncio.gather(
            collect(proc_engine, "ok0", PROMPTS[0], GREEDY),
            collect(proc_engine, "schema", PROMPTS[1], bad_schema),
            collect(proc_engine, "vocab", [1, 10**6], GREEDY),
            collect(proc_engine, "seed", PROMPTS[2], bad_seed),
            collect(proc_engine, "ok1", PROMPTS[3], GREEDY),
            return_exceptions=True,
        )

    ok0, schema, vocab, seed, ok1 = asyncio.run(main())
    assert isinstance(schema, EngineRequestError) and "response_format" in str(schema)
    assert isinstance(vocab, EngineRequestError) and "token ids" in str(vocab)
    assert isinstance(seed, EngineError) and "Overflow" in str(seed)
    expect = run_batch(local_engine, GREEDY)
    assert tokens_of(ok0) == tokens_of(expect[0]) and tokens_of(ok1) == tokens_of(expect[3])
    assert proc_engine.is_healthy()


def test_a_killed_engine_process_fails_every_request_and_reports_unhealthy(dev_model):
    eng = ProcessEngine.start(dev_model, settings_for(dev_model), 2)
    long = SamplingOptions(max_new_tokens=4000, top_k=1)

    async def main():
        streams = [eng.generate(f"k{i}", p, long) for i, p in enumerate(PROMPTS[:3])]
        for stream in streams:
            await stream.__anext__()  # all three are running
        os.kill(eng.pid, signal.SIGKILL)

        async def drain(stream):
            async for _ in stream:
                pass

        return await asyncio.gather(*[drain(s) for s in streams], return_exceptions=True)

    try:
        results = asyncio.run(main())
        assert all(isinstance(r, EngineError) and "SIGKILL" in str(r) for r in results)
        assert not eng.is_healthy()
        with pytest.raises(EngineError, match="SIGKILL"):
            asyncio.run(collect(eng, "late", PROMPTS[0], GREEDY))
    finally:
        eng.shutdown()


def test_shutdown_ends_pending_streams_and_leaves_no_child(dev_model):
    eng = ProcessEngine.start(dev_model, settings_for(dev_model), 2)
    pid = eng.pid

    async def main():
        stream = eng.generate("s", PROMPTS[0], SamplingOptions(max_new_tokens=4000, top_k=1))
        await stream.__anext__()
        await asyncio.to_thread(eng.shutdown)
        async for _ in stream:
            pass

    with pytest.raises(EngineError, match="shut down"):
        asyncio.run(main())
    assert eng._proc.returncode == 0  # it exited on its own, not killed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # exited and reaped
    assert not eng.is_healthy()
    eng.shutdown()  # idempotent


def test_a_bad_checkpoint_is_one_clear_error_at_load(dev_model, tmp_path):
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        if (dev_model / name).is_file():
            shutil.copy(dev_model / name, tmp_path / name)
    (tmp_path / "config.json").write_text('{"model_type": "mistral", "max_position_embeddings"')
    with pytest.raises(EngineError, match=r"could not start: \w+Error: \S") as err:
        ProcessEngine.start(tmp_path, settings_for(tmp_path), 2)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("value", "device", "own"),
    [("on", "cpu", True), ("on", "cuda", True), ("off", "cuda", False), ("off", "cpu", False)],
)
def test_the_setting_decides_where_the_engine_runs(value, device, own):
    assert wants_own_process(Settings(engine_process=value, device=device)) is own
    assert Settings().engine_process == "off"


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=20).filter(lambda v: v not in ("on", "off")))
def test_a_bad_engine_process_value_is_a_clear_settings_error(value):
    with pytest.raises(SettingsError, match="engine_process"):
        Settings.load({}, {"MTT_ENGINE_PROCESS": value})


def test_the_replay_engine_in_its_own_process_equals_it_in_process(dev_model, tok):
    """engine=replay with engine_process=on (the serving layer measured over this IPC):
    the same deltas, logprobs and prompt logprobs as in-process; a refusal is the
    request's EngineRequestError; an abort ends the stream."""
    values = {"engine": "replay", "replay_step_ms": 1.0, "max_batch_size": 8}
    own_s = settings_for(dev_model, engine_process="on", **values)
    local_s = settings_for(dev_model, **values)
    own = start_engine(open_artifact(dev_model, own_s), own_s, tok)
    local = start_engine(open_artifact(dev_model, local_s), local_s, tok)
    try:
        assert isinstance(own, ProcessEngine) and not isinstance(local, ProcessEngine)
        assert (own.info.name, own.limits, own.eos_token_id) == (
            local.info.name,
            local.limits,
            local.eos_token_id,
        )
        assert own.vocab_size == local.vocab_size == tok.vocab_size
        for opts in (
            SamplingOptions(max_new_tokens=12, logprobs=2, prompt_logprobs=1),
            SamplingOptions(max_new_tokens=0, prompt_logprobs=0),
        ):
            ours, theirs = run_batch(own, opts), run_batch(local, opts)
            assert [stream_of(d) for d in ours] == [stream_of(d) for d in theirs]
            assert all(stream_of(d)[3] == ["length"] for d in ours)
        guided = SamplingOptions(4, guided=GuidedDecoding("json_object"))
        with pytest.raises(EngineRequestError, match="response_format is not supported"):
            asyncio.run(collect(own, "g", PROMPTS[0], guided))

        async def aborted() -> list:
            stream = own.generate("a", PROMPTS[0], SamplingOptions(max_new_tokens=100_000))
            first = await stream.__anext__()
            own.abort("a")
            return [first] + [d async for d in stream]

        deltas = asyncio.run(aborted())
        assert deltas[-1].finish_reason == "abort" and len(tokens_of(deltas)) < 100_000
        wait_until(lambda: own.num_running() == 0, "the aborted request to leave")
        assert own.is_healthy()
    finally:
        own.shutdown()
        local.shutdown()
    assert not own.is_healthy()
