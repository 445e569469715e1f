"""One engine process shared by several front-ends (`engines/process/sharing.py`, the
worker's guests, `ProcessEngine.join`): a real engine process running the replay engine on
the dev model's tokenizer, an owner that started it and guests that joined it. Each
front-end gets its own requests' tokens (the same request ids in two front-ends are two
requests), a guest that leaves has its requests aborted while the others go on, the
owner's shutdown waits for the guests (for a bounded time), and a connection that does
not speak the protocol is dropped without disturbing anyone."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mistral_gpu_fallback.process import ipc
from mistral_gpu_fallback.process.client import ProcessEngine
from mistral_gpu_fallback.process.sharing import (
    ADDRESS_ENV,
    ROLE_ENV,
    SharedEngine,
    SharingError,
)
from mistral_serving.engines.base import EngineError, SamplingOptions
from mistral_serving.settings import Settings

DEADLINE_S = 60  # a bound on waiting for a condition, never a speed assertion


def replay_settings(dev_model: Path, step_ms: float = 2.0) -> Settings:
    return Settings(
        artifact=str(dev_model),
        device="cpu",
        engine="replay",
        engine_process="on",
        replay_step_ms=step_ms,
    )


@pytest.fixture
def address() -> Iterator[str]:
    workdir = tempfile.mkdtemp(prefix="mtt-")  # short: a Unix socket path has ~100 bytes
    yield os.path.join(workdir, "engine.sock")
    shutil.rmtree(workdir, ignore_errors=True)


def start_owner(dev_model: Path, tok, address: str, wait_s: float = 30.0, step_ms: float = 2.0):
    return ProcessEngine.start(
        dev_model, replay_settings(dev_model, step_ms), tok.eos_id, None, address, wait_s
    )


async def collect(engine: ProcessEngine, request_id: str, prompt: list[int], n: int) -> list[int]:
    tokens: list[int] = []
    async for delta in engine.generate(request_id, prompt, SamplingOptions(max_new_tokens=n)):
        tokens += delta.token_ids
    return tokens


async def ending(stream) -> object:
    """How a stream ended: its last finish reason, or the exception it raised."""
    last: object = None
    try:
        async for delta in stream:
            last = delta.finish_reason
    except EngineError as exc:
        return exc
    return last


def cut(ended: object) -> bool:
    """Ended by the engine's going: the replay engine aborts what it holds when it stops
    (finish reason "abort"), the PyTorch engine fails it (EngineError)."""
    return ended == "abort" or isinstance(ended, EngineError)


def test_guests_share_the_engine_each_with_its_own_requests(dev_model, tok, address):
    owner = start_owner(dev_model, tok, address)
    guests = [ProcessEngine.join(address) for _ in range(2)]
    try:
        assert all(
            g.limits == owner.limits and g.eos_token_id == owner.eos_token_id for g in guests
        )
        assert guests[0].info.details["engine_process"] == "shared"
        prompts = [[1, 100 + i, 200 + i][: 1 + i % 3] for i in range(4)]

        async def main() -> list[list[list[int]]]:
            # The same request ids in every front-end: each is a request of its own.
            return await asyncio.gather(
                *[
                    asyncio.gather(*[collect(e, f"r{i}", p, 12 + i) for i, p in enumerate(prompts)])
                    for e in [owner, *guests]
                ]
            )

        answers = asyncio.run(main())
        assert all(len(tokens) == 12 + i for per in answers for i, tokens in enumerate(per))
        assert answers[0] == answers[1] == answers[2]  # the replay engine is deterministic
        assert owner.is_healthy() and all(g.is_healthy() for g in guests)
    finally:
        for guest in guests:
            guest.shutdown()
        owner.shutdown()
    assert owner._proc is not None and owner._proc.returncode == 0


def test_a_guest_that_leaves_has_its_requests_aborted_and_the_others_go_on(dev_model, tok, address):
    owner = start_owner(dev_model, tok, address, step_ms=5.0)
    guest = ProcessEngine.join(address)
    try:

        async def main() -> tuple[object, list[int]]:
            theirs = guest.generate("same", [1, 5], SamplingOptions(max_new_tokens=100_000))
            ours = asyncio.create_task(collect(owner, "same", [1, 5], 60))
            await theirs.__anext__()  # the guest's request runs
            await asyncio.to_thread(guest.shutdown)
            return await ending(theirs), await ours

        ended, ours = asyncio.run(main())
        assert cut(ended)
        assert len(ours) == 60  # the owner's request of the same id was not touched
        # The engine let go of the guest's request: nothing runs once the owner's is done.
        for _ in range(DEADLINE_S * 10):
            if owner.num_running() == 0:
                break
            threading.Event().wait(0.1)
        assert owner.num_running() == 0
        assert not guest.is_healthy() and owner.is_healthy()
    finally:
        guest.shutdown()
        owner.shutdown()


def test_the_owners_shutdown_waits_for_the_guests_streams(dev_model, tok, address):
    owner = start_owner(dev_model, tok, address, wait_s=DEADLINE_S, step_ms=5.0)
    guest = ProcessEngine.join(address)
    try:

        async def main() -> list[int]:
            stream = collect(guest, "g", [1, 7], 80)
            task = asyncio.create_task(stream)
            while guest.num_running() == 0:
                await asyncio.sleep(0.01)
            stopping = asyncio.create_task(asyncio.to_thread(owner.shutdown))
            tokens = await task  # the engine serves on while a guest is joined
            assert not stopping.done()
            await asyncio.to_thread(guest.shutdown)  # the guest leaves: the engine stops
            await stopping
            return tokens

        assert len(asyncio.run(main())) == 80
        assert owner._proc is not None and owner._proc.returncode == 0
    finally:
        guest.shutdown()
        owner.shutdown()


def test_the_owners_shutdown_waits_for_guests_no_longer_than_it_was_told(dev_model, tok, address):
    owner = start_owner(dev_model, tok, address, wait_s=0.5)
    guest = ProcessEngine.join(address)

    async def main() -> object:
        stream = guest.generate("g", [1, 7], SamplingOptions(max_new_tokens=1_000_000))
        await stream.__anext__()
        await asyncio.to_thread(owner.shutdown)  # the guest never leaves
        return await ending(stream)

    try:
        assert cut(asyncio.run(main()))
        assert owner._proc is not None and owner._proc.returncode == 0  # not killed
        assert not guest.is_healthy()
    finally:
        guest.shutdown()
        owner.shutdown()


def raw_guest(address: str) -> Connection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    return Connection(sock.detach())


def closed_by_the_engine(conn: Connection) -> bool:
    """Whether the engine process closes this connection (it sends nothing more)."""
    try:
        while conn.poll(DEADLINE_S):
            conn.recv_bytes()
    except EOFError:
        return True
    return False


@pytest.mark.parametrize(
    "first",
    [
        ipc.encode(ipc.Add(0, "r", [1, 2], SamplingOptions(max_new_tokens=4))),  # before Join
        b"\xc1 not msgpack",  # not a message
        ipc.encode(ipc.Start("x", "{}", 2, 20, False)),  # a guest may not start anything
    ],
)
def test_a_connection_that_does_not_join_is_dropped_and_the_engine_serves_on(
    dev_model, tok, address, first
):
    owner = start_owner(dev_model, tok, address)
    try:
        conn = raw_guest(address)
        conn.send_bytes(first)
        assert closed_by_the_engine(conn)
        conn.close()
        joined = raw_guest(address)  # after Join, garbage drops it too
        joined.send_bytes(ipc.encode(ipc.Join()))
        assert isinstance(ipc.decode_from_engine(joined.recv_bytes()), ipc.Ready)
        joined.send_bytes(ipc.encode(ipc.Join()))  # a second Join
        assert closed_by_the_engine(joined)
        joined.close()
        assert len(asyncio.run(collect(owner, "r", [1, 2], 5))) == 5
        assert owner.is_healthy()
    finally:
        owner.shutdown()


def test_a_dead_engine_process_fails_the_guests_streams(dev_model, tok, address):
    owner = start_owner(dev_model, tok, address)
    guest = ProcessEngine.join(address)

    async def main() -> object:
        stream = guest.generate("g", [1, 7], SamplingOptions(max_new_tokens=1_000_000))
        await stream.__anext__()
        assert owner.pid is not None
        os.kill(owner.pid, signal.SIGKILL)
        return await ending(stream)

    try:
        ended = asyncio.run(main())
        assert isinstance(ended, EngineError) and "closed its connection" in str(ended)
        assert not guest.is_healthy()
        with pytest.raises(EngineError):
            asyncio.run(collect(guest, "late", [1, 2], 3))
    finally:
        guest.shutdown()
        owner.shutdown()


def test_a_guest_gets_a_clear_error_when_no_engine_listens(address):
    with pytest.raises(EngineError, match="did not listen within"):
        ProcessEngine.join(address, timeout_s=0.3)


def test_a_guest_gets_a_clear_error_when_the_owners_engine_fails_to_load(tok, address, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # no tokenizer: the engine cannot load
    outcome: dict[str, BaseException] = {}

    def join() -> None:
        try:
            # It either joins while the engine loads (then reads the end) or finds no
            # socket (the failed start removed it) and gives up after this.
            ProcessEngine.join(address, timeout_s=3.0)
        except BaseException as exc:  # noqa: BLE001 - what the guest was told
            outcome["guest"] = exc

    thread = threading.Thread(target=join)
    thread.start()
    with pytest.raises(EngineError, match="could not start"):
        ProcessEngine.start(tmp_path, replay_settings(tmp_path), tok.eos_id, None, address, 1.0)
    thread.join(DEADLINE_S + 5)
    error = outcome.get("guest")
    assert isinstance(error, EngineError)
    assert "ended before it was ready" in str(error) or "did not listen" in str(error)


def test_a_guest_request_in_a_step_reaches_only_that_guest(dev_model, tok, address):
    """A step's message to a front-end carries only its own requests' events."""
    owner = start_owner(dev_model, tok, address)
    try:
        conn = raw_guest(address)
        conn.send_bytes(ipc.encode(ipc.Join()))
        assert isinstance(ipc.decode_from_engine(conn.recv_bytes()), ipc.Ready)
        conn.send_bytes(ipc.encode(ipc.Add(7, "x", [1, 2], SamplingOptions(max_new_tokens=6))))

        async def owners() -> list[int]:
            return await collect(owner, "x", [1, 2], 30)

        thread_result: dict[str, list[int]] = {}
        thread = threading.Thread(target=lambda: thread_result.update(t=asyncio.run(owners())))
        thread.start()
        keys: set[int] = set()
        got = 0
        while got < 6:
            message = ipc.decode_from_engine(conn.recv_bytes())
            if isinstance(message, ipc.Step):
                keys |= {e.key for e in message.events}
                got += sum(len(e.token_ids) for e in message.events)
        thread.join(DEADLINE_S)
        assert keys == {7} and got == 6
        assert len(thread_result["t"]) == 30
        conn.close()
    finally:
        owner.shutdown()


@given(
    st.dictionaries(
        st.sampled_from([ROLE_ENV, ADDRESS_ENV, "OTHER"]),
        st.one_of(
            st.sampled_from(["owner", "guest", "", "/tmp/mtt-x/engine.sock", "relative.sock"]),
            st.text(max_size=300),
        ),
    )
)
def test_the_shared_engine_environment_is_read_or_refused_clearly(environ):
    try:
        shared = SharedEngine.from_environ(environ)
    except SharingError as exc:
        assert "\n" not in str(exc)
        return
    if shared is not None:
        assert shared.role in ("owner", "guest") and os.path.isabs(shared.address)
        assert SharedEngine.from_environ(shared.environ()) == shared


@pytest.mark.parametrize("engine", ["auto", "trtllm_pytorch"])
def test_an_engine_that_cannot_be_shared_is_refused_by_name(
    tmp_path, dev_model, tok, monkeypatch, engine
):
    """TensorRT-LLM serves from the front-end's own process: with several front-ends
    each would load a copy on the one GPU. The factory refuses it, saying what to set."""
    from mistral_serving.artifacts.artifact import ArtifactError, open_artifact
    from mistral_serving.engines.factory import start_engine
    from tests.doubles.trtllm_helpers import make_engine_dir

    model = make_engine_dir(tmp_path) if engine == "auto" else dev_model
    settings = Settings(
        artifact=str(model), engine=engine, engine_process="on", frontend_processes=2
    )
    monkeypatch.setenv(ROLE_ENV, "guest")
    monkeypatch.setenv(ADDRESS_ENV, "/tmp/mtt-none/engine.sock")
    with pytest.raises(ArtifactError, match="frontend_processes=2 needs an engine") as err:
        start_engine(open_artifact(model, settings), settings, tok)
    assert "set frontend_processes=1" in str(err.value)


def test_an_owner_that_breaks_the_protocol_stops_the_engine_process(dev_model, tok, address):
    """The owner is the one that stops the engine: if it sends what only a guest may (a
    Join), the engine process stops as for its EOF, instead of serving on with no owner."""
    owner = start_owner(dev_model, tok, address)
    guest = ProcessEngine.join(address)
    try:
        owner._send(ipc.Join())
        assert owner._proc is not None
        assert owner._proc.wait(DEADLINE_S) == 0  # it stopped on its own
        for _ in range(DEADLINE_S * 10):
            if not guest.is_healthy():
                break
            threading.Event().wait(0.1)
        assert not guest.is_healthy()
    finally:
        guest.shutdown()
        owner.shutdown()


def test_a_half_sent_message_holds_no_other_front_end(dev_model, tok, address):
    """A guest that sends the start of a message and no more: the others' requests are
    served meanwhile (the engine read it whole, blocking every front-end's intake), and
    the guest is cut off once FRAME_TIMEOUT_S has passed."""
    owner = start_owner(dev_model, tok, address)
    try:
        half = raw_guest(address)
        half.send_bytes(ipc.encode(ipc.Join()))
        assert isinstance(ipc.decode_from_engine(half.recv_bytes()), ipc.Ready)
        frame = ipc.encode(ipc.Add(0, "r", [1, 2], SamplingOptions(max_new_tokens=4)))
        with socket.socket(fileno=os.dup(half.fileno())) as raw:
            raw.sendall(struct.pack("!i", len(frame)) + frame[:3])

        async def served() -> list[int]:
            async with asyncio.timeout(DEADLINE_S):
                return await collect(owner, "o", [1, 2], 5)

        assert len(asyncio.run(served())) == 5
        assert closed_by_the_engine(half)
        half.close()
        assert owner.is_healthy()
    finally:
        owner.shutdown()


HUNG_GUEST = """
import socket, sys, time
from multiprocessing.connection import Connection
from mistral_gpu_fallback.process import ipc
from mistral_serving.engines.base import SamplingOptions

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
conn = Connection(sock.detach())
conn.send_bytes(ipc.encode(ipc.Join()))
conn.recv_bytes()
for i in range(64):
    add = ipc.Add(i, f"h{i}", [1, 2], SamplingOptions(max_new_tokens=10**6, ignore_eos=True))
    conn.send_bytes(ipc.encode(add))
print("asked", flush=True)
time.sleep(600)  # never reads again: its steps pile up in the engine's socket
"""


def test_a_guest_that_stops_reading_holds_no_other_front_end(dev_model, tok, address):
    """A front-end process that stops reading (hung, stopped): the engine's writes to it
    never hold its step thread, so the owner's stream goes on; the hung one is cut off and
    killed (so that the launcher notices) once OUTBOX_STALL_S has passed."""
    owner = start_owner(dev_model, tok, address)
    packages = Path(__file__).resolve().parents[2] / "mistral-trt-truss" / "packages"
    env = os.environ | {"PYTHONPATH": str(packages)}
    hung = subprocess.Popen(
        [sys.executable, "-c", HUNG_GUEST, address], stdout=subprocess.PIPE, env=env, text=True
    )
    try:
        assert hung.stdout is not None and hung.stdout.readline().strip() == "asked"

        async def served() -> list[int]:
            async with asyncio.timeout(DEADLINE_S):  # its steps filled the buffers long before
                return await collect(owner, "o", [1, 2], 2000)

        assert len(asyncio.run(served())) == 2000
        assert hung.wait(DEADLINE_S) == -signal.SIGKILL
        assert owner.is_healthy()
    finally:
        if hung.poll() is None:
            hung.kill()
            hung.wait()
        owner.shutdown()
