"""The host memory a process can still take: reclaimable page cache counts, a pod limit caps."""

from __future__ import annotations

from pathlib import Path

from radixserve.host_memory import available_memory_bytes

GIB_KB = 1 << 20


def meminfo(tmp_path: Path, free_kb: int, available_kb: int) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(
        f"MemTotal:       {24 * GIB_KB} kB\n"
        f"MemFree:        {free_kb} kB\n"
        f"MemAvailable:   {available_kb} kB\n"
        f"Cached:         {available_kb - free_kb} kB\n"
    )
    return path


def test_the_machine_has_some():
    assert available_memory_bytes() > 0


def test_page_cache_counts_as_available(tmp_path):
    """A machine that has read files for a while: 1.5 GiB free, 20 GiB available. The CPU KV
    pool was once sized from the free figure and refused to start on such a CI machine."""
    info = meminfo(tmp_path, free_kb=3 * GIB_KB // 2, available_kb=20 * GIB_KB)
    assert available_memory_bytes(info, tmp_path / "no-cgroup") == 20 << 30


def test_unreadable_meminfo_gives_nothing(tmp_path):
    assert available_memory_bytes(tmp_path / "missing", tmp_path) == 0


def test_a_pod_limit_caps_it_and_inactive_file_cache_is_reclaimable(tmp_path):
    info = meminfo(tmp_path, free_kb=GIB_KB, available_kb=20 * GIB_KB)
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("1000\n")
    assert available_memory_bytes(info, cgroup) == 20 << 30  # no limit: the machine's
    (cgroup / "memory.max").write_text("5000\n")
    assert available_memory_bytes(info, cgroup) == 4000  # no stat file: all usage is taken
    (cgroup / "memory.stat").write_text("anon 600\nfile 400\nactive_file 100\ninactive_file 300\n")
    assert available_memory_bytes(info, cgroup) == 4300
    (cgroup / "memory.current").write_text("9000\n")  # over the limit: no headroom
    assert available_memory_bytes(info, cgroup) == 0
