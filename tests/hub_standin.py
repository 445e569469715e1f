"""A loopback STAND-IN for the Hugging Face Hub's HTTP routes, for tests only.

It is not the Hub and not a Hub emulator: it implements just the requests that
`huggingface_hub` 2.4.0 sends for what we use (read from the client's source: hf_api.py,
_commit_api.py, lfs.py, file_download.py, _snapshot_download.py), in memory, on
127.0.0.1, so the real client can push and pull an artifact without a network:

  POST /api/repos/create                               create_repo (409 when it exists)
  POST /api/models/{repo}/branch/{branch}              create_branch (409 when it exists)
  GET  /api/models/{repo}[/revision/{rev}]             model_info / repo_info (commit sha)
  GET  /api/models/{repo}/tree/{rev}                   list_repo_tree / list_repo_files
  POST /api/models/{repo}/preupload/{rev}              upload mode per file (regular | lfs)
  POST /{repo}.git/info/lfs/objects/batch              LFS batch API, "basic" transfer
  PUT  /_lfs/{oid}   POST /_lfs/{oid}/verify           LFS object upload + verify
  POST /api/models/{repo}/commit/{rev}                 ndjson commit (file/lfsFile/deleted*)
  HEAD|GET /{repo}/resolve/{rev}/{path}                file metadata + download

Differences from the real Hub, on purpose: uploads go through the legacy LFS protocol, so
the client must run with Xet disabled (`HF_HUB_DISABLE_XET=1` / `constants.HF_HUB_DISABLE_XET`);
downloads are served directly (no CDN redirect); only model repos exist. A token, when
the stand-in is given one, is required for writes and for reading private repos; a wrong
token is answered 401 "Invalid credentials in Authorization header", as the Hub does. Every
request is recorded (`requests`) so tests can check what the client sent.

A slow Hub on demand: `hub.hold_downloads()` makes every file download wait until
`hub.release_downloads()`.

Faults on demand: `hub.answer_with(500)` (or 403, or 200 with a body that is not JSON)
answers every request whose path starts with `prefix` that way until
`hub.answer_normally()`, so tests can see how a client reports a Hub that misbehaves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_MIN_SIZE = 1 << 20
LFS_SUFFIXES = (".safetensors", ".engine", ".model", ".bin")


def git_blob_sha(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class StoredFile:
    content: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\n"
            f"size {len(self.content)}\n"
        ).encode()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else git_blob_sha(self.content)


@dataclass
class Repo:
    private: bool
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit sha
    commits: dict[str, dict[str, StoredFile]] = field(default_factory=dict)  # sha -> tree

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


@dataclass(frozen=True)
class Fault:
    """A canned answer for every request whose path starts with `prefix`."""

    status: int
    body: bytes
    content_type: str
    prefix: str


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names


class HubState:
    def __init__(self, token: str | None) -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.lfs: dict[str, bytes] = {}  # sha256 -> content
        self.requests: list[Recorded] = []
        self.lock = threading.Lock()
        self.counter = 0
        self.fault: Fault | None = None
        self.downloads = threading.Event()  # cleared: file downloads wait (hold_downloads)
        self.downloads.set()

    def new_commit(self, repo: Repo, tree: dict[str, StoredFile], message: str) -> str:
        self.counter += 1
        digest = hashlib.sha1(f"{self.counter}:{message}".encode())
        for path in sorted(tree):
            digest.update(f"{path}:{tree[path].etag}".encode())
        sha = digest.hexdigest()
        repo.commits[sha] = tree
        return sha


class HttpError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, **extra: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra


class Handler(BaseHTTPRequestHandler):
    server: StandInServer  # type: ignore[assignment]

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    # -- plumbing -------------------------------------------------------------------

    @property
    def state(self) -> HubState:
        return self.server.state

    def read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
             content_type: str = "application/json", head: bool = False) -> None:  # fmt: skip
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def send_json(
        self, obj: object, status: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        self.send(status, json.dumps(obj).encode(), headers)

    def authorized(self) -> bool:
        if self.state.token is None:
            return True
        given = self.headers.get("Authorization")
        if given is not None and given != f"Bearer {self.state.token}":
            raise HttpError(401, "Invalid credentials in Authorization header")
        return given is not None

    def require_write(self) -> None:
        if not self.authorized():
            raise HttpError(401, "Invalid credentials in Authorization header")

    def repo(self, repo_id: str) -> Repo:
        authorized = self.authorized()  # first: a wrong token is a 401 even on a public repo
        repo = self.state.repos.get(repo_id)
        if repo is None or (repo.private and not authorized):
            raise HttpError(404, f"Repository Not Found for url: {repo_id}", "RepoNotFound")
        return repo

    def commit_of(self, repo: Repo, revision: str) -> str:
        sha = repo.resolve(revision)
        if sha is None:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return sha

    def dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        with self.state.lock:
            self.state.requests.append(
                Recorded(method, url.path, {k.lower(): v for k, v in self.headers.items()})
            )
        fault = self.state.fault
        if fault is not None and url.path.startswith(fault.prefix):
            return self.send(fault.status, fault.body, content_type=fault.content_type,
                             head=method == "HEAD")  # fmt: skip
        try:
            with self.state.lock:
                self.route(method, parts)
        except HttpError as err:
            headers = {"X-Error-Code": err.code} if err.code else {}
            headers["X-Error-Message"] = err.message
            self.send_json({"error": err.message, **err.extra}, err.status, headers)

    do_GET = lambda self: self.dispatch("GET")  # noqa: E731
    do_HEAD = lambda self: self.dispatch("HEAD")  # noqa: E731
    do_POST = lambda self: self.dispatch("POST")  # noqa: E731
    do_PUT = lambda self: self.dispatch("PUT")  # noqa: E731

    # -- routes ---------------------------------------------------------------------

    def route(self, method: str, p: list[str]) -> None:
        if method == "POST" and p[:3] == ["api", "repos", "create"]:
            return self.create_repo()
        if p[:2] == ["api", "models"] and len(p) >= 4:
            repo_id = f"{p[2]}/{p[3]}"
            rest = p[4:]
            if method == "GET" and not rest:
                return self.model_info(repo_id, "main")
            if method == "GET" and rest[0] == "revision":
                return self.model_info(repo_id, "/".join(rest[1:]))
            if method == "GET" and rest[0] == "tree":
                return self.tree(repo_id, rest[1])
            if method == "POST" and rest[0] == "branch":
                return self.create_branch(repo_id, "/".join(rest[1:]))
            if method == "POST" and rest[0] == "preupload":
                return self.preupload(repo_id, "/".join(rest[1:]))
            if method == "POST" and rest[0] == "commit":
                return self.commit(repo_id, "/".join(rest[1:]))
        if p[0] == "_lfs" and method == "PUT":
            return self.lfs_put(p[1])
        if p[0] == "_lfs" and method == "POST" and p[-1] == "verify":
            return self.lfs_verify(p[1])
        if method == "POST" and len(p) >= 2 and p[1].endswith(".git") and p[2:] == [
            "info", "lfs", "objects", "batch"
        ]:  # fmt: skip
            return self.lfs_batch(f"{p[0]}/{p[1][: -len('.git')]}")
        if method in ("GET", "HEAD") and len(p) >= 5 and p[2] == "resolve":
            return self.resolve(f"{p[0]}/{p[1]}", p[3], "/".join(p[4:]), head=method == "HEAD")
        raise HttpError(404, f"stand-in: no route for {method} /{'/'.join(p)}")

    def create_repo(self) -> None:
        self.require_write()
        body = json.loads(self.read_body() or b"{}")
        repo_id = f"{body['organization']}/{body['name']}"
        if repo_id in self.state.repos:
            # The client reads "url" from the 409 body too (create_repo with exist_ok=True).
            raise HttpError(
                409, "You already created this model repo", url=f"{self.server.url}/{repo_id}"
            )
        private = bool(body.get("private")) or body.get("visibility") == "private"
        repo = Repo(private=private)
        initial = {
            ".gitattributes": StoredFile(b"*.engine filter=lfs diff=lfs merge=lfs -text\n", False)
        }
        repo.branches["main"] = self.state.new_commit(repo, initial, "initial commit")
        self.state.repos[repo_id] = repo
        self.send_json({"url": f"{self.server.url}/{repo_id}", "name": repo_id})

    def create_branch(self, repo_id: str, branch: str) -> None:
        self.require_write()
        repo = self.repo(repo_id)
        body = json.loads(self.read_body() or b"{}")
        if branch in repo.branches:
            raise HttpError(409, "Reference already exists")
        repo.branches[branch] = self.commit_of(repo, body.get("startingPoint") or "main")
        self.send_json({})

    def model_info(self, repo_id: str, revision: str) -> None:
        repo = self.repo(repo_id)
        sha = self.commit_of(repo, revision)
        siblings = [{"rfilename": path} for path in sorted(repo.commits[sha])]
        self.send_json({"id": repo_id, "sha": sha, "private": repo.private, "siblings": siblings})

    def tree(self, repo_id: str, revision: str) -> None:
        repo = self.repo(repo_id)
        files = repo.commits[self.commit_of(repo, revision)]
        entries = []
        for path, f in sorted(files.items()):
            entry: dict = {"type": "file", "path": path, "size": len(f.content)}
            if f.lfs:
                pointer = f.pointer()
                entry["oid"] = git_blob_sha(pointer)
                entry["lfs"] = {
                    "oid": f.sha256,
                    "size": len(f.content),
                    "pointerSize": len(pointer),
                }
            else:
                entry["oid"] = git_blob_sha(f.content)
            entries.append(entry)
        self.send_json(entries)

    def preupload(self, repo_id: str, revision: str) -> None:
        self.require_write()
        repo = self.repo(repo_id)
        self.commit_of(repo, revision)
        body = json.loads(self.read_body())
        files = []
        for f in body["files"]:
            lfs = f["size"] >= LFS_MIN_SIZE or f["path"].endswith(LFS_SUFFIXES)
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular",
                          "shouldIgnore": False, "oid": None})  # fmt: skip
        self.send_json({"files": files, "commitOid": repo.resolve(revision)})

    def lfs_batch(self, repo_id: str) -> None:
        self.require_write()
        self.repo(repo_id)
        body = json.loads(self.read_body())
        objects = []
        for obj in body["objects"]:
            oid, size = obj["oid"], obj["size"]
            if oid in self.state.lfs:  # already uploaded (e.g. by an interrupted run): skip
                objects.append({"oid": oid, "size": size})
                continue
            base = f"{self.server.url}/_lfs/{oid}"
            objects.append({"oid": oid, "size": size, "actions": {
                "upload": {"href": base},
                "verify": {"href": f"{base}/verify"},
            }})  # fmt: skip
        self.send_json({"transfer": "basic", "objects": objects})

    def lfs_put(self, oid: str) -> None:
        data = self.read_body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise HttpError(400, "content does not match oid")
        self.state.lfs[oid] = data
        self.send(200)

    def lfs_verify(self, oid: str) -> None:
        self.require_write()
        body = json.loads(self.read_body())
        if oid not in self.state.lfs or len(self.state.lfs[oid]) != body["size"]:
            raise HttpError(404, f"LFS object {oid} not uploaded")
        self.send_json({})

    def commit(self, repo_id: str, revision: str) -> None:
        self.require_write()
        repo = self.repo(repo_id)
        if revision not in repo.branches:
            raise HttpError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        tree = dict(repo.commits[repo.branches[revision]])
        message = ""
        for line in self.read_body().splitlines():
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                message = value.get("summary", "")
                parent = value.get("parentCommit")
                if parent and parent != repo.branches[revision]:
                    raise HttpError(412, "parent commit is not the head of the branch")
            elif key == "file":
                tree[value["path"]] = StoredFile(base64.b64decode(value["content"]), False)
            elif key == "lfsFile":
                content = self.state.lfs.get(value["oid"])
                if content is None:
                    raise HttpError(400, f"LFS object {value['oid']} was never uploaded")
                tree[value["path"]] = StoredFile(content, True)
            elif key == "deletedFile":
                if tree.pop(value["path"], None) is None:
                    raise HttpError(404, "A file with this name doesn't exist", "EntryNotFound")
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                tree = {k: v for k, v in tree.items() if not k.startswith(prefix)}
        sha = self.state.new_commit(repo, tree, message)
        repo.branches[revision] = sha
        self.send_json({"commitUrl": f"{self.server.url}/{repo_id}/commit/{sha}",
                        "commitOid": sha, "success": True})  # fmt: skip

    def resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        repo = self.repo(repo_id)
        sha = self.commit_of(repo, revision)
        f = repo.commits[sha].get(path)
        if f is None:
            raise HttpError(404, f"Entry not found: {path}", "EntryNotFound")
        headers = {"X-Repo-Commit": sha, "ETag": f'"{f.etag}"'}
        if not head:
            self.state.downloads.wait(300)  # held: a client that loads stays loading
        if f.lfs:
            headers |= {"X-Linked-Etag": f'"{f.etag}"', "X-Linked-Size": str(len(f.content))}
        self.send(200, f.content, headers, "application/octet-stream", head=head)


class StandInServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, token: str | None) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.state = HubState(token)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class HubStandIn:
    """`with HubStandIn(token="...") as hub:` ... `hub.url` is the HF_ENDPOINT to use."""

    def __init__(self, token: str | None = None) -> None:
        self.server = StandInServer(token)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def state(self) -> HubState:
        return self.server.state

    def answer_with(
        self,
        status: int,
        body: bytes = b'{"error": "stand-in fault"}',
        content_type: str = "application/json",
        prefix: str = "/",
    ) -> None:
        """Answer every request under `prefix` with this status and body from now on."""
        self.state.fault = Fault(status, body, content_type, prefix)

    def answer_normally(self) -> None:
        self.state.fault = None

    def hold_downloads(self) -> None:
        """File downloads wait from now on until `release_downloads()` (a slow Hub)."""
        self.state.downloads.clear()

    def release_downloads(self) -> None:
        self.state.downloads.set()

    def __enter__(self) -> HubStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
