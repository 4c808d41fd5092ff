"""The host memory an offload may pin (torch_uvm/host_memory.py), read from
fake /proc and /sys/fs/cgroup trees: MemAvailable, and in a container the
room its memory cgroup leaves (v2 and v1, at its level and those above),
whichever is less."""
import os

from torch_uvm.host_memory import host_room

GiB = 1 << 30


def tree(tmp_path, meminfo_gib=None, cgroup_lines=(), files=None):
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    cgroups.mkdir()
    if meminfo_gib is not None:
        kib = meminfo_gib * GiB // 1024
        (proc / "meminfo").write_text(f"MemTotal: 999 kB\nMemAvailable: {kib} kB\n")
    (proc / "self" / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    for path, text in (files or {}).items():
        f = cgroups / path
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return str(proc), str(cgroups)


def test_without_a_cgroup_limit_memavailable_says(tmp_path):
    proc, cgroups = tree(tmp_path, 100, ["0::/"], {"memory.max": "max\n", "memory.current": "5\n"})
    assert host_room(proc, cgroups) == (100 * GiB, "MemAvailable")


def test_a_v2_limit_below_memavailable_bounds_it_less_its_working_set(tmp_path):
    proc, cgroups = tree(tmp_path, 100, ["0::/job"], {
        "job/memory.max": f"{24 * GiB}\n", "job/memory.current": f"{10 * GiB}\n",
        "job/memory.stat": f"anon 1\ninactive_file {4 * GiB}\nactive_file 3\n"})
    room, what = host_room(proc, cgroups)
    assert room == 18 * GiB                     # 24 - (10 - 4): inactive file pages reclaim first
    assert what == f"the memory cgroup /job's memory.max ({24 * GiB} bytes)"


def test_a_limit_above_its_cgroup_counts_too(tmp_path):
    proc, cgroups = tree(tmp_path, 100, ["0::/outer/inner"], {
        "outer/memory.max": f"{16 * GiB}\n", "outer/memory.current": f"{12 * GiB}\n",
        "outer/inner/memory.max": "max\n", "outer/inner/memory.current": f"{2 * GiB}\n"})
    assert host_room(proc, cgroups)[0] == 4 * GiB


def test_a_v1_memory_controller_and_its_no_limit(tmp_path):
    proc, cgroups = tree(tmp_path, 100, ["4:memory:/ctr", "3:cpu:/"], {
        "memory/ctr/memory.limit_in_bytes": f"{8 * GiB}\n",
        "memory/ctr/memory.usage_in_bytes": f"{3 * GiB}\n",
        "memory/ctr/memory.stat": f"total_inactive_file {GiB}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
        "memory/memory.usage_in_bytes": f"{50 * GiB}\n"})
    assert host_room(proc, cgroups) == (6 * GiB, f"the memory cgroup /ctr's "
                                                 f"memory.limit_in_bytes ({8 * GiB} bytes)")


def test_a_container_sees_its_own_cgroup_as_the_mounts_root(tmp_path):
    # /proc/self/cgroup names a path the container's mount does not show
    proc, cgroups = tree(tmp_path, 100, ["0::/kubepods/pod1/ctr"], {
        "memory.max": f"{20 * GiB}\n", "memory.current": f"{5 * GiB}\n"})
    assert host_room(proc, cgroups)[0] == 15 * GiB


def test_nothing_to_read_says_nothing(tmp_path):
    proc, cgroups = tree(tmp_path)
    os.remove(os.path.join(proc, "self", "cgroup"))
    assert host_room(proc, cgroups) is None
