"""The verify Job's environment on this machine: its user, its working directory, its HOME,
its emptyDirs and its variables, laid out under one directory from what the rendered
Dockerfiles and `k8s/verify/job.yaml` say (not from a hand-written copy of them).

- The images: every `COPY` to an absolute path of the serving Dockerfile and of
  `Dockerfile.verify` is replayed from the rendered build context (the server in /app,
  /packages, the tooling in the verify image's WORKDIR), root-owned; so is every
  `RUN mkdir -p ... && chown -R UID:GID ...` (HOME and its .cache, /workspace, /app/data,
  the tooling's `.cache`), and the verify image's `ENV` of folders.
- The Job: each volumeMount becomes a directory owned by the pod's user and fsGroup (an
  emptyDir with fsGroup); like the kubelet, missing parents of a mount path are created
  root-owned. Its env is taken as is (a secret becomes a placeholder), HOME and the paths
  of its arguments are moved under the layout's root, and its command's shell runs (tini
  left out) with this interpreter for the image's python3.
- The process runs as the Job's uid and gid (the test box is root: the user is created as
  the image's Dockerfile creates it) from the read-only, root-owned working directory.
  Where this process is not root it runs as itself, from the same read-only directory.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mistral_build import image
from mistral_build.paths import K8S_DIR

JOB_FILE = K8S_DIR / "verify" / "job.yaml"
IMAGE_PYTHON = image.BASE_IMAGE_PYTHON
_CHOWN = re.compile(r"chown -R (\d+):(\d+) ([^&\n]+)")
_MKDIR = re.compile(r"mkdir -p ([^&\n]+)")


@dataclass
class JobLayout:
    root: Path  # everything the Job sees is under here
    workdir: Path  # the verify image's WORKDIR (read-only, root-owned)
    home: Path
    uid: int
    gid: int
    fs_group: int
    env: dict[str, str]
    command: list[str]  # the container's command with its args
    python: str  # the image's python3 here
    mounts: dict[str, Path] = field(default_factory=dict)
    dockerfiles: tuple[str, str] = ("", "")  # the serving image's and the verify image's

    def path(self, container_path: str) -> Path:
        return self.root / container_path.lstrip("/")

    def run(
        self, extra_args: list[str], env: dict[str, str] | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        """The container's command (with `extra_args` appended) as the Job runs it."""
        return subprocess.run(
            [*self.command, *extra_args],
            cwd=self.workdir,
            env=self.env | (env or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
            **self.as_user(),
        )

    def as_user(self) -> dict[str, Any]:
        if os.geteuid() != 0:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": [self.fs_group]}


def job_container(job_file: Path = JOB_FILE) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, its one container) of the rendered Job."""
    job = yaml.safe_load(job_file.read_text())
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def ensure_user(uid: int, gid: int) -> None:
    """The image's `app` user (its Dockerfile runs `useradd -u 60000 ... app`): libraries
    look the uid up (pwd), so a uid without an entry is not what the image runs."""
    if os.geteuid() != 0:
        return
    try:
        pwd.getpwuid(uid)
        return
    except KeyError:
        pass
    name = "app"
    try:
        taken = pwd.getpwnam(name).pw_uid != uid
    except KeyError:
        taken = False
    subprocess.run(["groupadd", "-f", "-g", str(gid), f"mtt-g{gid}"], check=False)
    args = ["useradd", "-u", str(uid), "-g", str(gid), "-M", "-s", "/bin/sh"]
    subprocess.run([*args, f"mtt-app-{uid}" if taken else name], check=True)


def _owned_dirs(dockerfile: str, variables: dict[str, str]) -> list[tuple[str, int, int]]:
    """(container path, uid, gid) of each directory a `mkdir -p` / `chown -R` RUN line makes
    or hands over; `${VAR}` expanded from `variables`."""

    def expand(text: str) -> list[str]:
        for name, value in variables.items():
            text = text.replace("${" + name + "}", value).replace("$" + name, value)
        return text.split()

    found: list[tuple[str, int, int]] = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        if not line.startswith("RUN ") or "chown -R" not in line:
            continue
        chown = _CHOWN.search(line)
        assert chown is not None, line
        uid, gid = int(chown.group(1)), int(chown.group(2))
        made = [p for m in _MKDIR.finditer(line) for p in expand(m.group(1))]
        found += [(p, -1, -1) for p in made]  # made (root) first, then handed over
        found += [(p, uid, gid) for p in expand(chown.group(3))]
    return found


def _make_dir(path: Path, uid: int, gid: int, mode: int = 0o755) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    if os.geteuid() == 0 and uid >= 0:
        os.chown(path, uid, gid)


def _chown_tree(tree: Path, uid: int, gid: int) -> None:
    """`chown -R uid:gid tree` (as root; a no-op otherwise)."""
    if os.geteuid() != 0:
        return
    for dirpath, _dirnames, filenames in os.walk(tree):
        os.chown(dirpath, uid, gid)
        for name in filenames:
            os.chown(Path(dirpath) / name, uid, gid, follow_symlinks=False)


def _chown_file(path: Path, uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        os.chown(path, uid, gid, follow_symlinks=False)


def _read_only(tree: Path, keep: set[Path]) -> None:
    """As Docker's `COPY --chown=root:root` leaves the tooling: root-owned, modes as copied
    (files 644 or 755, folders 755), so only root may write; copies the Job makes of it are
    its own and writable. Not root here: the folders lose their write bit instead."""
    mode = 0o755 if os.geteuid() == 0 else 0o555
    for dirpath, dirnames, _filenames in os.walk(tree):
        here = Path(dirpath)
        if here in keep:
            dirnames[:] = []
            continue
        here.chmod(mode)


def render_context(staging: Path) -> Path:
    """The image's build context (both Dockerfiles), rendered as `build.py image` does."""
    return image.render_image_context(staging / "context")


def _expand(text: str, variables: dict[str, str]) -> str:
    for name, value in variables.items():
        text = text.replace("${" + name + "}", value).replace("$" + name, value)
    return text


def _replay_copies(dockerfile: str, context: Path, root: Path, variables: dict[str, str]) -> None:
    """Each `COPY [--chown=...] ./SRC DEST` with an absolute DEST, into `root`."""
    for line in dockerfile.splitlines():
        if not line.startswith("COPY "):
            continue
        parts = [p for p in line.split()[1:] if not p.startswith("--")]
        owner = next((p.split("=", 1)[1] for p in line.split() if p.startswith("--chown=")), "0:0")
        *sources, dest = (_expand(p, variables) for p in parts)
        if not dest.startswith("/"):
            continue  # build inputs copied to the working directory
        target = root / dest.lstrip("/")
        for source in sources:
            src = context / source
            into = target / src.name if dest.endswith("/") or len(sources) > 1 else target
            into.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, into, dirs_exist_ok=True)
            else:
                shutil.copyfile(src, into)
            uid, _, gid = owner.partition(":")
            if uid.isdigit() and gid.isdigit() and int(uid) != 0:
                if into.is_dir():
                    _chown_tree(into, int(uid), int(gid))
                else:
                    _chown_file(into, int(uid), int(gid))


def _image_env(dockerfile: str, root: Path) -> dict[str, str]:
    """The verify image's `ENV` of folders (VERIFY_GPU_*), moved under `root`."""
    env: dict[str, str] = {}
    for line in dockerfile.splitlines():
        if line.startswith("ENV VERIFY_GPU_"):
            for pair in line.split()[1:]:
                name, _, value = pair.partition("=")
                env[name] = str(root / value.strip('"').lstrip("/"))
    return env


def lay_out_job(root: Path, context: Path, job_file: Path = JOB_FILE) -> JobLayout:
    pod, container = job_container(job_file)
    security = container["securityContext"]
    uid, gid = int(security["runAsUser"]), int(security["runAsGroup"])
    fs_group = int(pod["securityContext"]["fsGroup"])
    ensure_user(uid, gid)
    root.chmod(0o755)
    env = _job_env(container, root)
    home = root / env["HOME"].removeprefix(str(root)).lstrip("/")
    serving = (context / "Dockerfile").read_text()
    verify = (context / image.VERIFY_DOCKERFILE).read_text()
    workdir = root / image.TOOLS_HOME.lstrip("/")
    variables = {"HOME": env["HOME"].removeprefix(str(root)) or "/", "APP_HOME": image.APP_DIR}
    for dockerfile in (serving, verify):
        _replay_copies(dockerfile, context, root, variables)
    env |= _image_env(verify, root)
    handed: set[Path] = set()
    for container_path, owner, group in _owned_dirs(serving, variables) + _owned_dirs(
        verify, variables
    ):
        target = root / container_path.lstrip("/")
        _make_dir(target, 0, 0)
        if owner >= 0:
            _chown_tree(target, owner, group)
            handed.add(target)
    for tree in (workdir, root / image.APP_DIR.lstrip("/"), root / image.PACKAGES_DIR.lstrip("/")):
        _read_only(tree, handed)
    mounts = _mount_volumes(container, root, uid, fs_group)
    python = job_python(root)
    command = _job_command(container, root, python)
    return JobLayout(root, workdir, home, uid, gid, fs_group, env, command, python, mounts)


def _job_env(container: dict[str, Any], root: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:  # a secretKeyRef: the value is the cluster's; any token stands in
            env[item["name"]] = "hf_placeholder_token_for_tests"
    env["HOME"] = str(root / env.get("HOME", "/root").lstrip("/"))
    env["TMPDIR"] = str(root / "tmp")
    env["PATH"] = os.environ["PATH"]
    return env


def _mount_volumes(
    container: dict[str, Any], root: Path, uid: int, fs_group: int
) -> dict[str, Path]:
    mounts: dict[str, Path] = {}
    for mount in container.get("volumeMounts") or []:
        target = root / mount["mountPath"].lstrip("/")
        for parent in reversed(target.relative_to(root).parents):
            if str(parent) != "." and not (root / parent).exists():
                _make_dir(root / parent, 0, 0)  # the kubelet makes missing parents, as root
        _make_dir(target, uid, fs_group, 0o2775)
        mounts[mount["name"]] = target
    return mounts


def _reachable_by_others(path: Path) -> bool:
    """Every directory above `path` lets other users through, and `path` is executable."""
    real = Path(os.path.realpath(path))
    return all(p.stat().st_mode & 0o001 for p in [real, *real.parents])


def job_python(root: Path) -> str:
    """An interpreter the Job's user can run with this environment's packages: this one,
    or (where it sits under a private directory, e.g. pyenv in /root) a venv of the system's
    python of the same version whose site-packages add this environment's."""
    if os.geteuid() != 0 or _reachable_by_others(Path(sys.executable)):
        return sys.executable
    base = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not _reachable_by_others(base):
        return sys.executable  # the run will say why it cannot start
    venv = root / "python"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    ours = sysconfig.get_paths()["purelib"]
    (site / "job-python.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return str(venv / "bin" / "python")  # made with root's umask: readable by everyone


def _job_command(container: dict[str, Any], root: Path, python: str) -> list[str]:
    command = list(container["command"])
    if command[0].endswith("/tini"):
        command = command[2:]  # tini -- ...: the shell it starts
    command = [part.replace(IMAGE_PYTHON, python) for part in command]
    args = [
        str(root / a.lstrip("/")) if a.startswith("/tmp/") else a for a in container.get("args", [])
    ]
    return command + args


def image_entrypoint(dockerfile: str, python: str) -> list[str]:
    """A Dockerfile's ENTRYPOINT (exec form), tini left out, this interpreter for the
    image's python3."""
    line = next(ln for ln in dockerfile.splitlines() if ln.startswith("ENTRYPOINT "))
    argv = [str(a) for a in json.loads(line.removeprefix("ENTRYPOINT "))]
    if argv[0].endswith("/tini"):
        argv = argv[2:]
    return [a.replace(IMAGE_PYTHON, python) for a in argv]


@contextmanager
def laid_out_job() -> Iterator[JobLayout]:
    """The verify Job's environment in a directory of its own, removed after."""
    root = job_root()
    try:
        with tempfile.TemporaryDirectory() as staging:
            context = render_context(Path(staging))
            layout = lay_out_job(root, context)
            layout.dockerfiles = (
                (context / "Dockerfile").read_text(),
                (context / image.VERIFY_DOCKERFILE).read_text(),
            )
        yield layout
    finally:
        remove(root)


def job_root() -> Path:
    """A directory the Job's user can reach (pytest's tmp_path is private to root)."""
    return Path(tempfile.mkdtemp(prefix="mtt-verify-job-"))


def remove(root: Path) -> None:
    for dirpath, _dirnames, _files in os.walk(root):
        Path(dirpath).chmod(0o755)
    shutil.rmtree(root, ignore_errors=True)
