"""Production's path end to end: push an artifact to a (loopback stand-in of the) Hugging
Face Hub, then start the real Truss server with `artifact` = repo id + pinned revision and
the token in the Truss secret: load() pulls exactly that commit, checks its manifest and
serves it; the token never reaches the log."""

from __future__ import annotations

import pytest
import requests
from huggingface_hub import constants

from mistral_build.publish import push_artifact
from tests.e2e.util import scrape
from tests.hub_standin import HubStandIn

pytestmark = pytest.mark.e2e

TOKEN = "hf_standin_secret_for_the_served_test_0123"


def test_the_server_pulls_and_serves_a_pushed_revision(
    start_server, dev_model, tmp_path, monkeypatch
):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # the stand-in speaks LFS
    with HubStandIn(token=TOKEN) as hub:
        pushed = push_artifact(dev_model, "acme/served-dev", token=TOKEN, endpoint=hub.url)
        server = start_server(
            artifact="acme/served-dev",
            artifact_revision=pushed.commit_sha,
            cache_dir=str(tmp_path / "cache"),
            extra_env={
                "HF_ENDPOINT": hub.url,
                "HF_HUB_DISABLE_XET": "1",
                "TRUSS_SECRET_hf_access_token": TOKEN,
            },
        )
        r = requests.post(
            f"{server.url}/v1/models/model:predict",
            json={"prompt": "from the hub", "max_new_tokens": 4},
            timeout=60,
        )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    snapshot = tmp_path / "cache" / "hub"
    assert any(p.name == pushed.commit_sha for p in snapshot.rglob("*") if p.is_dir())
    info = [labels for (name, labels) in scrape(server.url) if name == "mtt:artifact_info"]
    assert any(("artifact", "acme/served-dev") in labels for labels in info)
    log = server.log()
    assert "hf_checkpoint" in log and TOKEN not in log
    server.stop()
