"""The real server refuses settings it could not serve with, before it starts: a
`MTT_SERVED_MODEL_NAME` that is not UTF-8 (it would make every OpenAI answer a 500) and a
non-finite drain grace end the start with status 2 and one line naming the setting; so
does an `MTT_*` variable that names no setting."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("name", "raw"),
    [("MTT_SERVED_MODEL_NAME", "caf\udce9"), ("MTT_DRAIN_GRACE_SECONDS", "inf")],
)
def test_the_server_refuses_an_unservable_setting(start_server, name: str, raw: str) -> None:
    server = start_server(wait=False, extra_env={name: raw})
    assert server.process.wait(120) == 2
    last = [line for line in server.log().splitlines() if line.strip()][-1]
    assert last.startswith("cannot start: invalid settings: ")
    assert name.removeprefix("MTT_").lower() in last


def test_the_server_refuses_a_setting_name_it_does_not_know(start_server) -> None:
    """A typo in a variable's name was served without a word (the default took its place)."""
    server = start_server(wait=False, extra_env={"MTT_MAX_INFLITE": "3"})
    assert server.process.wait(120) == 2
    last = [line for line in server.log().splitlines() if line.strip()][-1]
    assert last == "cannot start: MTT_MAX_INFLITE is not a setting (did you mean MTT_MAX_INFLIGHT?)"
