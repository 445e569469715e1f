"""CPUs the process may use: the affinity mask capped by the cgroup quota (v2 and v1),
read from fake cgroup trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mistral_serving.engines.pytorch import cpus
from mistral_serving.engines.pytorch.cpus import available_cpus, cgroup_cpu_quota


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def affinity(monkeypatch):
    """Pretend the process may run on `n` CPUs."""

    def set_n(n: int) -> None:
        monkeypatch.setattr(cpus.os, "sched_getaffinity", lambda pid: set(range(n)))

    return set_n


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"cpu.max": "max 100000\n"}, None),
        ({"cpu.max": "200000 100000\n"}, 2.0),
        ({"cpu.max": "150000 100000"}, 1.5),
        ({"cpu.max": "garbage"}, None),
        ({"cpu.max": "0 100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
        ({"cpu/cpu.cfs_quota_us": "300000", "cpu/cpu.cfs_period_us": "100000"}, 3.0),
        ({"cpu,cpuacct/cpu.cfs_quota_us": "50000", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 0.5),
        ({"cpu/cpu.cfs_quota_us": "300000"}, None),  # no period: unknown
        ({}, None),
    ],
)
def test_cgroup_quota(tmp_path, files, quota):
    for rel, text in files.items():
        write(tmp_path, rel, text)
    assert cgroup_cpu_quota(tmp_path) == quota


@pytest.mark.parametrize(
    ("cpu_max", "n_affinity", "expected"),
    [
        ("max 100000", 64, 64),  # no quota: the affinity mask
        ("200000 100000", 64, 2),  # a 2-CPU limit on a 64-core node
        ("150000 100000", 64, 2),  # 1.5 CPUs: round up, a thread needs a whole core
        ("50000 100000", 64, 1),
        ("800000 100000", 4, 4),  # quota above the cores we may run on
    ],
)
def test_available_cpus_is_the_smaller_of_quota_and_affinity(
    tmp_path, affinity, cpu_max, n_affinity, expected
):
    write(tmp_path, "cpu.max", cpu_max)
    affinity(n_affinity)
    assert available_cpus(tmp_path) == expected


def test_without_affinity_support_the_cpu_count_is_used(tmp_path, monkeypatch):
    monkeypatch.delattr(cpus.os, "sched_getaffinity")
    monkeypatch.setattr(cpus.os, "cpu_count", lambda: 12)
    write(tmp_path, "cpu.max", "400000 100000")
    assert available_cpus(tmp_path) == 4


def test_this_machine(tmp_path):
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))


def test_the_engine_uses_the_setting_or_the_available_cpus(dev_model: Path, monkeypatch):
    import torch

    from mistral_serving.engines.pytorch import dynamic as pytorch
    from mistral_serving.engines.pytorch.dynamic import TorchEngine
    from mistral_serving.settings import Settings

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(pytorch, "available_cpus", lambda: 1)
        eng = TorchEngine.from_pretrained(
            dev_model, Settings(artifact=str(dev_model), device="cpu"), 2
        )
        eng.shutdown()
        assert torch.get_num_threads() == 1 and eng.info.details["threads"] == 1
        eng = TorchEngine.from_pretrained(
            dev_model, Settings(artifact=str(dev_model), device="cpu", torch_threads=3), 2
        )
        eng.shutdown()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(("cpus", "threads"), [(1, 1), (2, 1), (3, 2), (8, 7)])
def test_torch_leaves_one_cpu_to_the_event_loop_by_default(cpus: int, threads: int) -> None:
    from mistral_serving.engines.pytorch.cpus import default_torch_threads

    assert default_torch_threads(cpus) == threads


def test_the_default_threads_leave_a_cpu_free(dev_model: Path, monkeypatch) -> None:
    import torch

    from mistral_serving.engines.pytorch import dynamic as pytorch
    from mistral_serving.engines.pytorch.dynamic import TorchEngine
    from mistral_serving.settings import Settings

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(pytorch, "available_cpus", lambda: 2)
        eng = TorchEngine.from_pretrained(
            dev_model, Settings(artifact=str(dev_model), device="cpu"), 2
        )
        eng.shutdown()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
