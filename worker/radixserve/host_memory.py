"""How much host memory this process can still take: one answer for the CPU KV pool's size and
the weight read-ahead's budget. Torch-free, so the front end can ask before it spawns.

Free memory is the wrong figure: a machine that has read files for a while keeps them in the
page cache, so MemFree can be a tenth of what an allocation would get (the kernel drops clean
cache on demand). MemAvailable counts that reclaimable cache; in a pod the cgroup's limit
is what the OOM killer enforces, with its inactive file cache likewise reclaimable (kubelet's
working set is usage less inactive_file).
"""

from __future__ import annotations

from pathlib import Path

PROC_MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")


def available_memory_bytes(meminfo: Path = PROC_MEMINFO, cgroup: Path = CGROUP) -> int:
    """MemAvailable from /proc/meminfo, or the cgroup v2 headroom (memory.max less the working
    set) when a pod limit is tighter. 0 where /proc/meminfo cannot be read."""
    available = 0
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        return 0
    headroom = _cgroup_headroom(cgroup)
    return available if headroom is None else min(available, headroom)


def _cgroup_headroom(cgroup: Path) -> int | None:
    """memory.max less (memory.current less inactive file cache); None without a limit."""
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int((cgroup / "memory.current").read_text())
    except (OSError, ValueError):
        return None  # no cgroup v2 memory controller here: the machine's figure stands
    try:
        for line in (cgroup / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "inactive_file":
                used -= int(value)
    except (OSError, ValueError):
        pass  # no stat file: count the whole usage as taken
    return max(int(limit) - used, 0)
