"""Where `make venv` gets PyTorch: prints the extra pip arguments for the dev install.

    python mistral_build/torch_index.py [auto|pypi|URL]   (Makefile: TORCH_INDEX_URL)

Plain PyPI's torch for Linux is the CUDA build: about 3 GB of wheels (torch plus some
twenty nvidia-* packages) that a machine without an NVIDIA GPU never uses. PyTorch's CPU
index has the same release as a CPU-only wheel of about 200 MB. `auto` (the default):

1. a wheel of the pinned torch that pip finds without any index (a `--find-links`
   folder, as on a machine with a local wheel store) -> nothing extra: it is used;
2. no NVIDIA GPU here -> `--extra-index-url` PyTorch's CPU index (its `+cpu` wheel
   outranks PyPI's build of the same version);
3. otherwise -> nothing extra: plain PyPI's CUDA build, for the GPU.

`pypi` forces plain PyPI; any other value is an index URL used as `--extra-index-url`.
Standard library only: it runs before anything is installed. The choice is printed on
stderr, the pip arguments on stdout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

CPU_INDEX_URL = "https://download.pytorch.org/whl/cpu"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def torch_pin(pyproject: Path = PYPROJECT) -> str:
    """The `torch==X` requirement of the dev extra."""
    match = re.search(r'"(torch==[^"]+)"', pyproject.read_text())
    if match is None:
        raise SystemExit(f"{pyproject}: no exact torch pin (torch==X) found")
    return match.group(1)


def has_nvidia_gpu() -> bool:
    gpus = Path("/proc/driver/nvidia/gpus")
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def found_without_index(requirement: str) -> bool:
    """Whether pip resolves `requirement` from local wheels alone (no index, no download)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-deps"]
    out = subprocess.run([*cmd, "--quiet", requirement], capture_output=True, timeout=300)
    return out.returncode == 0


def choose(
    setting: str,
    requirement: str,
    local: Callable[[str], bool] = found_without_index,
    gpu: Callable[[], bool] = has_nvidia_gpu,
) -> tuple[list[str], str]:
    """(pip arguments, why) for the TORCH_INDEX_URL setting."""
    setting = setting.strip()
    if setting == "pypi":
        return [], "plain PyPI (TORCH_INDEX_URL=pypi)"
    if setting not in ("", "auto"):
        if not re.match(r"^(https?|file)://\S+$", setting):
            raise SystemExit(
                f"TORCH_INDEX_URL={setting!r}: expected auto, pypi or an index URL "
                f"(e.g. {CPU_INDEX_URL})"
            )
        return ["--extra-index-url", setting], f"extra index {setting} (TORCH_INDEX_URL)"
    if local(requirement):
        return [], f"{requirement} from the local wheel store"
    if not gpu():
        return (
            ["--extra-index-url", CPU_INDEX_URL],
            f"{requirement}, CPU build from {CPU_INDEX_URL}: no NVIDIA GPU here "
            "(TORCH_INDEX_URL=pypi for PyPI's CUDA build)",
        )
    return [], f"{requirement}, CUDA build from PyPI: an NVIDIA GPU is here"


def main(argv: list[str]) -> int:
    args, why = choose(argv[0] if argv else "auto", torch_pin())
    print(f"torch: {why}", file=sys.stderr)
    print(" ".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
