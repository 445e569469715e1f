"""The build manifest as untrusted input, and the confined listing of an artifact's files:
crafted entry names, symlinks that leave the artifact (refused without touching their
target), special files, the Hugging Face cache layout, and hypothesis fuzzing of the
parser (every input is a manifest or one ManifestError line, never another exception)."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mistral_serving.artifacts import manifest as mf
from mistral_serving.artifacts.manifest import (
    MANIFEST_NAME,
    ArtifactError,
    BuildManifest,
    FileRecord,
    ManifestError,
    describe,
    name_problem,
    parse_manifest,
    read_manifest,
    scan_files,
    verify_files,
    write_manifest,
)

SHA = "ab" * 32
CRAFTED = [
    "../../../../etc/passwd",
    "/etc/shadow",
    "a/../../x",
    "a/./b",
    "..",
    ".",
    "",
    "a//b",
    "dir/",
    "bad\0name",
    "line\nbreak",
    "back\\slash",
    "..\\..\\windows",
    "C:/Windows/win.ini",
    "x" * 256,  # one component past NAME_MAX
    "/".join(["d"] * 600),  # past the name length bound
    "lone\ud800surrogate",
    "nbsp\xa0name",
]


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(err.value)
    assert message and "\n" not in message and "\r" not in message and "\0" not in message
    assert len(message) < 1000
    return message


def manifest_json(files: dict[str, object]) -> str:
    return json.dumps({"kind": "hf_checkpoint", "source_model": "m/m", "files": files})


# ---- entry names -------------------------------------------------------------------------


@pytest.mark.parametrize("name", CRAFTED)
def test_crafted_entry_names_are_refused_in_one_line(name: str) -> None:
    assert name_problem(name) is not None
    text = manifest_json({name: {"size": 1, "sha256": SHA}})
    with pytest.raises(ManifestError) as err:
        parse_manifest(text, "m.json")
    message = one_line(err)
    # pydantic's JSON parser refuses a lone surrogate itself, before the name check.
    assert "m.json" in message and ("refused" in message or "\ud800" in name)


@pytest.mark.parametrize(
    "name", ["config.json", "rank0.engine", "sub/dir/model.safetensors", ".gitattributes", "é.bin"]
)
def test_plain_relative_names_are_accepted(name: str) -> None:
    assert name_problem(name) is None
    assert set(parse_manifest(manifest_json({name: {"size": 0, "sha256": SHA}}), "m").files) == {
        name
    }


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"size": -1, "sha256": SHA}, "size"),
        ({"size": "8", "sha256": SHA}, "size"),  # no string-to-number coercion
        ({"size": True, "sha256": SHA}, "size"),
        ({"size": 1, "sha256": "x"}, "sha256"),
        ({"size": 1}, "sha256"),
    ],
)
def test_file_records_are_strict(record: dict, needle: str) -> None:
    with pytest.raises(ManifestError) as err:
        parse_manifest(manifest_json({"a": record}), "m")
    assert needle in one_line(err)


def test_newer_format_is_refused() -> None:
    text = json.dumps({"format_version": 99, "kind": "hf_checkpoint", "source_model": "m"})
    with pytest.raises(ManifestError, match="newer than this server reads"):
        parse_manifest(text, "m")


def test_manifest_errors_are_artifact_errors() -> None:
    assert issubclass(ManifestError, ArtifactError)


# ---- fuzzing the parser ------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
VALID = {
    "format_version": 1,
    "kind": "trtllm_engine",
    "source_model": "mistralai/Mistral-7B-Instruct-v0.2",
    "source_revision": "abc",
    "versions": {"tensorrt_llm": "1.2.1"},
    "gpu": {"name": "NVIDIA A100", "compute_capability": "8.0"},
    "build_options": {"dtype": "float16", "tp_size": 1, "max_batch_size": 8},
    "files": {
        "config.json": {"size": 10, "sha256": SHA},
        "rank0.engine": {"size": 9, "sha256": SHA},
    },
}


def check_parse(data: bytes | str) -> None:
    try:
        manifest = parse_manifest(data, "fuzz.json")
    except ManifestError as exc:
        message = str(exc)
        assert message and "\n" not in message and "\r" not in message and len(message) < 1000
        return
    assert all(name_problem(name) is None for name in manifest.files)
    line = describe(manifest)
    assert "\n" not in line


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    check_parse(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_fuzz_arbitrary_json(value: object) -> None:
    check_parse(json.dumps(value))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(VALID)),
    json_values,
    st.text(max_size=300),
    st.sampled_from(["replace", "rename_file", "drop", "nest"]),
)
def test_fuzz_mutated_valid_manifests(key: str, value: object, name: str, how: str) -> None:
    doc = json.loads(json.dumps(VALID))
    if how == "replace":
        doc[key] = value
    elif how == "rename_file":
        doc["files"][name] = doc["files"].pop("config.json")
    elif how == "drop":
        doc.pop(key)
    else:
        doc["build_options"][name] = value
    check_parse(json.dumps(doc))


@pytest.mark.parametrize(
    "data",
    [
        "[" * 100_000 + "]" * 100_000,  # nesting past any recursion limit
        '{"kind": "hf_checkpoint", "source_model": "m", "files": ' + "[" * 5000,
        b"\xff\xfe not utf-8",
        '{"kind": "hf_checkpoint", "source_model": "\\ud800"}',
        "",
    ],
)
def test_hostile_documents(data: str | bytes) -> None:
    with pytest.raises(ManifestError) as err:
        parse_manifest(data, "m")
    one_line(err)


def test_undecodable_file_name_on_disk_is_refused(tmp_path: Path) -> None:
    """os.scandir hands a non-UTF-8 name over as a lone surrogate: refused, in one line."""
    (tmp_path / os.fsdecode(b"caf\xe9.bin")).write_text("x")
    with pytest.raises(ManifestError) as err:
        scan_files(tmp_path)
    assert "not valid UTF-8" in one_line(err)


# ---- the confined listing of files ----------------------------------------------------------


class Touched:
    """Records every path that is stat-ed, listed or opened while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        for module, name in [(os, "lstat"), (os, "stat"), (os, "scandir"), (os, "open")]:
            self._wrap(monkeypatch, module, name)
        self._wrap(monkeypatch, io, "open")
        self._wrap(monkeypatch, builtins, "open")

    def _wrap(self, monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> None:
        real = getattr(module, name)

        def recorded(path: object, *args: object, **kwargs: object) -> object:
            if isinstance(path, (str, os.PathLike)):
                self.paths.append(os.fspath(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(module, name, recorded)

    def under(self, directory: Path) -> list[str]:
        return [p for p in self.paths if Path(p).is_relative_to(directory)]


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """An artifact and, beside it, a 'secret' folder it must never reach."""
    art = tmp_path / "artifact"
    (art / "sub").mkdir(parents=True)
    (art / "config.json").write_text("{}")
    (art / "sub" / "weights.bin").write_bytes(b"w" * 5)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd").write_text("root:x:0:0")
    return art, secret


def test_scan_lists_regular_files(layout: tuple[Path, Path]) -> None:
    art, _ = layout
    files = scan_files(art)
    assert set(files) == {"config.json", "sub/weights.bin"}
    assert files["sub/weights.bin"].size == 5


@pytest.mark.parametrize("relative", [True, False])
def test_symlink_out_is_refused_without_touching_its_target(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, relative: bool
) -> None:
    art, secret = layout
    target = os.path.relpath(secret / "passwd", art) if relative else str(secret / "passwd")
    (art / "tokenizer.model").symlink_to(target)
    touched = Touched(monkeypatch)
    with pytest.raises(ArtifactError) as err:
        scan_files(art)
    message = one_line(err)
    assert "tokenizer.model" in message and "outside the artifact" in message
    assert touched.under(secret) == []


def test_symlink_out_through_a_directory_link_is_refused(
    layout: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    art, secret = layout
    (art / "link").symlink_to(secret)  # a link to a directory outside
    touched = Touched(monkeypatch)
    with pytest.raises(ArtifactError, match="link: symlink to '.*secret', outside"):
        scan_files(art)
    assert touched.under(secret) == []


def test_symlink_inside_the_artifact_is_allowed(layout: tuple[Path, Path]) -> None:
    art, _ = layout
    (art / "alias.bin").symlink_to("sub/weights.bin")
    (art / "sub" / "back.json").symlink_to("../config.json")
    (art / "chain").symlink_to("alias.bin")  # link to a link, all inside
    files = scan_files(art)
    assert files["alias.bin"].size == 5 and files["chain"].size == 5
    assert files["sub/back.json"] == files["config.json"]


def test_symlink_that_leaves_and_comes_back_in_is_allowed(layout: tuple[Path, Path]) -> None:
    art, _ = layout
    (art / "roundtrip").symlink_to("../artifact/config.json")  # lexically inside again
    assert "roundtrip" in scan_files(art)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda art: (art / "dir-link").symlink_to("sub"), "symlink to a directory"),
        (lambda art: (art / "dangling").symlink_to("nowhere"), "missing"),
        (lambda art: (art / "loop").symlink_to("loop"), "symlink hops"),
        (lambda art: os.mkfifo(art / "fifo"), "not a regular file"),
        (lambda art: (art / "bad\nname").write_text("x"), "refused"),
        (lambda art: (art / "back\\slash").write_text("x"), "refused"),
    ],
)
def test_odd_entries_are_refused(layout: tuple[Path, Path], make, needle: str) -> None:
    art, _ = layout
    make(art)
    with pytest.raises(ArtifactError) as err:
        scan_files(art)
    assert needle in one_line(err)


def test_link_through_an_inner_directory_link_is_refused(layout: tuple[Path, Path]) -> None:
    art, _ = layout
    (art / "subalias").symlink_to("sub", target_is_directory=True)
    (art / "file").symlink_to("subalias/weights.bin")
    with pytest.raises(ArtifactError, match="not a plain directory"):
        scan_files(art)


def hf_cache_repo(root: Path) -> tuple[Path, Path]:
    """The layout huggingface_hub writes: snapshots/<sha>/<file> -> ../../blobs/<hash>."""
    repo = root / "hub" / "models--acme--m"
    snap = repo / "snapshots" / ("c" * 40)
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    snap.mkdir(parents=True)
    (repo / "blobs" / "1234").write_text("{}")
    (snap / "config.json").symlink_to("../../blobs/1234")
    return repo, snap


def test_hf_cache_snapshot_links_into_its_blobs(tmp_path: Path) -> None:
    repo, snap = hf_cache_repo(tmp_path)
    (snap / "sub").mkdir()
    (repo / "blobs" / "5678").write_bytes(b"12345")
    (snap / "sub" / "w.bin").symlink_to("../../../blobs/5678")
    files = scan_files(snap)
    assert set(files) == {"config.json", "sub/w.bin"} and files["sub/w.bin"].size == 5


@pytest.mark.parametrize("target", ["../../refs/main", "../../../models--other--x/blobs/1"])
def test_hf_cache_snapshot_may_not_reach_beyond_its_blobs(tmp_path: Path, target: str) -> None:
    repo, snap = hf_cache_repo(tmp_path)
    other = repo.parent / "models--other--x" / "blobs"
    other.mkdir(parents=True)
    (other / "1").write_text("other repo")
    (snap / "x.json").symlink_to(target)
    with pytest.raises(ArtifactError, match="x.json: symlink to .* outside the artifact"):
        scan_files(snap)


# ---- manifests against the files -------------------------------------------------------------


def artifact_with_manifest(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    write_manifest(path, BuildManifest(kind="hf_checkpoint", source_model="m/m"))
    return path


def test_write_then_read_then_verify(tmp_path: Path) -> None:
    art = artifact_with_manifest(tmp_path / "a")
    manifest = read_manifest(art)
    assert manifest is not None and set(manifest.files) == {"config.json", "model.safetensors"}
    verify_files(art, manifest)


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "/etc/shadow", "a/../../x"])
def test_crafted_manifest_never_reaches_outside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    art = artifact_with_manifest(tmp_path / "a")
    doc = json.loads((art / MANIFEST_NAME).read_text())
    doc["files"][name] = {"size": 1, "sha256": SHA}
    (art / MANIFEST_NAME).write_text(json.dumps(doc))
    touched = Touched(monkeypatch)
    with pytest.raises(ManifestError) as err:
        read_manifest(art)
    assert name in one_line(err)
    # Only the artifact and its own ancestors (resolving the configured path) are looked at.
    assert all(Path(p).is_relative_to(art) or art.is_relative_to(p) for p in touched.paths)


def test_verify_refuses_a_crafted_manifest_built_in_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BuildManifest made in code skips the parser: verify_files checks names again."""
    art = artifact_with_manifest(tmp_path / "a")
    manifest = BuildManifest(
        kind="hf_checkpoint",
        source_model="m",
        files={"../../../../etc/passwd": FileRecord(size=1, sha256=SHA)},
    )
    touched = Touched(monkeypatch)
    with pytest.raises(ManifestError, match="refused"):
        verify_files(art, manifest)
    assert not any("passwd" in p for p in touched.paths)


def test_manifest_that_is_a_symlink_out_is_refused(tmp_path: Path) -> None:
    art = tmp_path / "a"
    art.mkdir()
    (tmp_path / "elsewhere.json").write_text("{}")
    (art / MANIFEST_NAME).symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ArtifactError, match="outside the artifact"):
        read_manifest(art)


def test_oversized_manifest_is_refused_unread(tmp_path: Path, monkeypatch) -> None:
    art = artifact_with_manifest(tmp_path / "a")
    monkeypatch.setattr(mf, "MAX_JSON_BYTES", 10)
    with pytest.raises(ManifestError, match="at most 10 bytes"):
        read_manifest(art)


def test_describe_survives_odd_build_options() -> None:
    manifest = BuildManifest(
        kind="trtllm_engine",
        source_model="m",
        build_options={"dtype": 3, "quantization": ["x"], "tp_size": {"a": 1}},
    )
    assert "\n" not in describe(manifest)
