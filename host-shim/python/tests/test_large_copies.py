"""Results copied out of scratch memory as ``bytes``: the client keeps
glibc's malloc from giving result buffers back to the kernel
(sluice._malloc; counted as page faults, in fresh interpreters so the
process-wide setting of one case cannot leak into another), and copies
results of 32 MiB or more into huge pages without the interpreter lock
(sluice._bigcopy)."""

import mmap
import os
import platform
import resource
import subprocess
import sys
import textwrap

import pytest

import sluice
from _helpers import payload
from sluice import _bigcopy, _malloc
from sluice.region import Region

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Eight 1 MiB results alive at once, then freed, 40 times over, as a loader
# thread consumes a batch: without the setting every batch faults its 8 MiB
# in again (~2,048 faults a batch).
SCRIPT = textwrap.dedent(
    """
    import ctypes, mmap, os, resource, threading
    from sluice import _malloc

    # Where transparent huge pages are "always", a heap refaults in 2 MiB
    # pages and the counts below would not tell; keep 4 KiB pages here.
    ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE
    from sluice.region import Region

    fd = os.memfd_create("t")
    os.ftruncate(fd, 8 << 20)
    mm = mmap.mmap(fd, 8 << 20, flags=mmap.MAP_SHARED)
    pattern = bytes(range(256)) * 256
    for off in range(0, 8 << 20, len(pattern)):  # no big temporary: freeing one would raise malloc's thresholds
        mm[off : off + len(pattern)] = pattern
    region = Region(None, "r1", 8 << 20, mm)
    assert region.read(3, 5) == bytes([3, 4, 5, 6, 7])
    assert _malloc.tuned() is None, "a small copy must not tune malloc"
    faults = []

    def consume():
        data = None
        for n in range(41):
            if n == 1:  # the first batch grows the heap; count the rest
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            batch = []
            for i in range(8):
                data = region.read(i << 20, 1 << 20)
                batch.append(data)
            assert batch[7] == mm[7 << 20 : 8 << 20]
            del batch  # `data`, the newest, lives on until the next batch's first
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)

    t = threading.Thread(target=consume)
    t.start()
    t.join()
    print(_malloc.tuned(), faults[0])
    """
)


def _run(**env: str) -> "tuple[str, int]":
    full = {
        k: v
        for k, v in os.environ.items()
        if k not in ("SLUICE_MALLOC_TUNING", "GLIBC_TUNABLES") and not k.startswith("MALLOC_")
    }
    full.update(env)
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    full["PYTHONPATH"] = os.pathsep.join(p for p in [src, full.get("PYTHONPATH", "")] if p)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    state, faults = out.stdout.split()
    return state, int(faults)


@glibc_only
def test_large_copies_stop_faulting_once_malloc_keeps_its_memory() -> None:
    state, faults = _run()
    assert state == "True"
    # 40 batches of 8 MiB: ~80,000 faults without the setting; a few with it.
    assert faults < 2_000, faults


@glibc_only
def test_the_setting_can_be_turned_off_and_then_the_faults_come_back() -> None:
    state, faults = _run(SLUICE_MALLOC_TUNING="0")
    assert state == "False"
    assert faults > 20_000, faults


@glibc_only
def test_a_process_that_chose_its_own_malloc_tunables_is_left_alone() -> None:
    state, _ = _run(GLIBC_TUNABLES="glibc.malloc.arena_max=2")
    assert state == "False"
    state, _ = _run(MALLOC_TRIM_THRESHOLD_="0")
    assert state == "False"


def test_large_objects_as_bytes_through_a_live_stack(stack, prefix) -> None:
    big = payload((33 << 20) + 5, "big-bytes")  # above malloc's mmap threshold, even tuned
    mid = payload((1 << 20) + 3, "mid-bytes")
    with sluice.Client(stack.socket) as c:
        c.put(f"{prefix}/big", big)
        c.put(f"{prefix}/mid", mid)
        for _ in range(3):
            assert c.get_bytes(f"{prefix}/big") == big
            assert c.get_bytes(f"{prefix}/big", range=(3, len(big) - 6)) == big[3:-3]
            res = c.get_many([f"{prefix}/mid", f"{prefix}/missing", f"{prefix}/big"] + [f"{prefix}/mid"] * 8)
            assert res[0].data == mid and res[2].data == big and all(r.data == mid for r in res[3:])
            assert isinstance(res[1].error, sluice.NoSuchKey)
    assert _malloc.tuned() is (_malloc._wanted() is None)


def _memfd(n: int, prot: int = mmap.PROT_READ | mmap.PROT_WRITE) -> mmap.mmap:
    fd = os.memfd_create("sluice-test")
    try:
        os.ftruncate(fd, n)
        chunk = payload(1 << 20, "big-copy")
        with mmap.mmap(fd, n, flags=mmap.MAP_SHARED) as w:
            for off in range(0, n, len(chunk)):
                w[off : off + len(chunk)] = chunk[: n - off]
        return mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=prot)
    finally:
        os.close(fd)


def _thp_counters() -> "tuple[int, int]":
    """Huge pages given at a fault, and refused (the fallback), so far."""
    counts = {}
    with open("/proc/vmstat") as f:
        for line in f:
            name, _, value = line.partition(" ")
            counts[name] = int(value)
    return counts.get("thp_fault_alloc", 0), counts.get("thp_fault_fallback", 0)


def _thp_off() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" in f.read()
    except OSError:
        return True


@pytest.mark.skipif(not _bigcopy.available(), reason="CPython on Linux only")
def test_copies_of_32_mib_and_more_are_the_memory_at_any_offset() -> None:
    n = _bigcopy.MIN_BYTES + (5 << 20) + 3
    mm = _memfd(n)
    region = Region(None, "r1", n, mm)
    for off, length in ((0, _bigcopy.MIN_BYTES), (1, _bigcopy.MIN_BYTES + 4097), (4095, n - 4095), (3, n - 3)):
        got = region.read(off, length)
        assert type(got) is bytes and len(got) == length
        assert got == mm[off : off + length], (off, length)
    # Just below the threshold: the plain copy, same bytes.
    assert region.read(7, _bigcopy.MIN_BYTES - 1) == mm[7 : 7 + _bigcopy.MIN_BYTES - 1]
    region._invalidate()
    with pytest.raises(sluice.RegionReleased):
        region.read(0, _bigcopy.MIN_BYTES)


def test_a_read_only_mapping_falls_back_to_the_plain_copy() -> None:
    n = _bigcopy.MIN_BYTES + 4096
    mm = _memfd(n, prot=mmap.PROT_READ)
    region = Region(None, "r2", n, mm)
    assert region.read(9, n - 9) == mm[9:]


@pytest.mark.skipif(not _bigcopy.available() or _thp_off(), reason="needs CPython and transparent huge pages")
def test_a_64_mib_copy_faults_in_huge_pages() -> None:
    n = 64 << 20
    region = Region(None, "r3", n, _memfd(n))
    region.read(0, n)  # the source's own pages are mapped here once
    thp_before = _thp_counters()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        got = region.read(0, n)
        del got
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 4
    given, refused = (a - b for a, b in zip(_thp_counters(), thp_before))
    if given == 0:
        pytest.skip(f"the kernel gave no huge page ({refused} refused: fragmented memory, defrag off or a limit)")
    # 16,384 faults of 4 KiB pages each time without huge pages; 32 of 2 MiB
    # with them (some fall back when the kernel has none free at once).
    assert faults < 4096, (faults, given, refused)
