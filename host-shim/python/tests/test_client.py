"""Every call of the blocking client against a real stack."""

from __future__ import annotations

import fcntl
import mmap
import os
import sys
import threading

import numpy as np
import pytest

import sluice
from _helpers import payload


def test_handshake(stack, client):
    assert client.tenant == stack.tenant == "default"
    assert "data" in client.namespaces
    assert client.socket_path == stack.socket
    assert not client.closed


def test_capabilities_from_the_handshake(client):
    caps = client.capabilities
    assert isinstance(caps, sluice.Capabilities)
    # A co-located stack: memfds on both sides, no GPU staging.
    assert caps.agent_memory == ["memfd"] and caps.region_memory == ["memfd"]
    assert caps.gpu_staging == "" and caps.max_batch_items > 0
    data = caps.namespaces["data"]
    assert isinstance(data, sluice.NamespaceCapabilities)
    assert data.data_path == "http" and data.transport == "http-only" and data.encryption == "none"
    assert set(data.access) == {"read", "write", "list", "delete"}
    assert data.max_object_bytes >= 5 << 30 and data.request_timeout_ms > 0
    assert sorted(caps.namespaces) == sorted(client.namespaces)


def test_socket_from_environment(stack, monkeypatch):
    monkeypatch.setenv("SLUICE_SOCKET", stack.socket)
    with sluice.Client() as c:
        assert c.socket_path == stack.socket and c.tenant == "default"


def test_register_shim_memfd_is_shared_memory(client, prefix):
    data = payload(100_000, "reg")
    client.put(f"{prefix}/obj", data)
    with client.register(256 << 10) as region:
        assert isinstance(region, sluice.Region)
        assert len(region) == region.nbytes == 256 << 10 and not region.client_created
        view = region.view
        assert isinstance(view, memoryview) and not view.readonly and view.nbytes == 256 << 10
        arr = region.numpy()
        assert arr.dtype == np.uint8 and arr.shape == (256 << 10,)
        arr[:] = 0xEE
        t = client.get(f"{prefix}/obj", into=region, offset=1000)
        assert t.bytes == len(data) and t.object_size == len(data)
        assert t.data_path in ("http", "rdma", "rdma-staged") and t.transport == t.data_path
        assert t.fallback_reason == "" and not t.fell_back and t.parts >= 1 and t.request_id
        # The shim wrote straight into our mapping: the numpy view sees it.
        assert arr[999] == 0xEE and arr[1000 + len(data)] == 0xEE
        assert arr[1000 : 1000 + len(data)].tobytes() == data
        assert bytes(view[1000 : 1000 + len(data)]) == data
        assert region.read(1000, len(data)) == data
        typed = region.numpy(dtype=np.uint32, count=4, offset=1000)
        assert typed.tobytes() == data[:16]
        if sys.version_info >= (3, 12):  # PEP 688 buffer protocol
            assert bytes(memoryview(region)[1000 : 1000 + 16]) == data[:16]
        del view, arr, typed
    assert region.released


def test_register_client_memfd(client, prefix):
    region = client.register(64 << 10, local=True)
    try:
        assert region.client_created
        data = payload(5000, "local")
        region.write(data, offset=10)
        t = client.put(f"{prefix}/from-local", region, 10, len(data), content_type="application/x-test")
        assert t.bytes == len(data) and t.object_size == len(data) and t.etag
        info = client.head(f"{prefix}/from-local")
        assert info.size == len(data) and info.content_type == "application/x-test"
        region.numpy()[:] = 0
        client.get(f"{prefix}/from-local", into=region)
        assert region.read(0, len(data)) == data
    finally:
        client.release(region)


def test_register_own_fd(client, prefix):
    fd = os.memfd_create("pytest-region", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 1 << 16)
        # Unsealed, the file could be truncated under the agent's mapping:
        # refused, with the fix in the message.
        with pytest.raises(sluice.BadRequest) as e:
            client.register(1 << 16, fd=fd)
        assert "F_SEAL_SHRINK" in e.value.message
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
        region = client.register(1 << 16, fd=fd)
        client.put(f"{prefix}/fd", b"via my fd")
        t = client.get(f"{prefix}/fd", into=region)
        # Our own mapping of the same file sees the bytes too.
        with mmap.mmap(fd, 1 << 16) as mine:
            assert mine[: t.bytes] == b"via my fd"
        client.release(region)
        # A file shorter than the length asked for is refused by the shim.
        with pytest.raises(sluice.RegionTooSmall) as e:
            client.register(1 << 20, fd=fd)
        assert e.value.code is sluice.ErrorCode.REGION_TOO_SMALL
    finally:
        os.close(fd)


def test_a_descriptor_that_is_not_open_is_a_bad_request(client):
    fd = os.open("/dev/null", os.O_RDONLY)
    os.close(fd)  # a number this process does not have open
    for bad in (fd, -1, 1 << 40):
        with pytest.raises(sluice.BadRequest, match="not an open descriptor"):
            client.register(4096, fd=bad)
    client.stats()  # the connection is unharmed
    with client.register(4096) as region:
        assert region.nbytes == 4096


def test_a_regular_file_is_no_region(client, tmp_path):
    """A file anyone could truncate under the agent's mapping is refused
    (the truncation attacks themselves are in tests/tests/reliability.rs)."""
    regular = tmp_path / "plain-file"
    regular.write_bytes(b"\0" * 4096)
    with open(regular, "r+b") as f, pytest.raises(sluice.BadRequest) as e:
        client.register(4096, fd=f.fileno())
    assert "not a memfd" in e.value.message


def test_register_dmabuf_refuses_what_is_not_a_dmabuf(client):
    before = client.stats().regions
    fd = os.memfd_create("not-a-dmabuf")
    try:
        os.ftruncate(fd, 4096)
        with pytest.raises(sluice.BadRequest) as e:
            client.register_dmabuf(fd, 4096, gpu_address=0x7F0000000000)
        assert "not a dma-buf" in str(e.value)
        assert e.value.code is sluice.ErrorCode.BAD_REQUEST
        with pytest.raises(sluice.BadRequest):
            client.register_dmabuf(fd, -1)
    finally:
        os.close(fd)
    # The connection is still usable and nothing was registered.
    assert client.stats().regions == before


def test_unsupported_is_a_typed_error():
    err = sluice.errors.from_detail(21, "GPU regions need the doca backend")
    assert isinstance(err, sluice.Unsupported) and err.code is sluice.ErrorCode.UNSUPPORTED


def test_torch_frombuffer_if_installed(client, prefix):
    torch = pytest.importorskip("torch")
    client.put(f"{prefix}/t", bytes(range(16)))
    with client.register(4096) as region:
        client.get(f"{prefix}/t", into=region)
        tensor = region.torch(count=16)
        assert tensor.dtype == torch.uint8 and tensor.tolist() == list(range(16))


def test_get_ranges_and_offsets(client, prefix):
    data = payload(10_000, "range")
    client.put(f"{prefix}/r", data)
    with client.register(64 << 10) as region:
        t = client.get(f"{prefix}/r", region, 100, (500, 1000))
        assert t.bytes == 1000 and t.object_size == len(data)
        assert region.read(100, 1000) == data[500:1500]
        t = client.get(f"{prefix}/r", into=region, offset=0, range=(9000, None))
        assert t.bytes == 1000 and region.read(0, 1000) == data[9000:]
        # A range running past the end is cut at the end (S3 semantics).
        t = client.get(f"{prefix}/r", into=region, range=(9990, 100))
        assert t.bytes == 10 and region.read(0, 10) == data[9990:]
        # By region id works too.
        t = client.get(f"{prefix}/r", into=region.id, range=range(0, 4))
        assert t.bytes == 4 and region.read(0, 4) == data[:4]
    assert client.get_bytes(f"{prefix}/r", range=(10, 5)) == data[10:15]
    assert client.get_bytes(f"{prefix}/r", (9995, None)) == data[9995:]


def test_ranged_gets_pinned_to_one_version(client, prefix):
    """A reader splitting one object into ranged GETs pins them to the
    version the first saw (``if_match``); a replaced object fails the next
    one with PreconditionFailed and writes nothing, alone or in a batch."""
    old, new = payload(20_000, "v1"), payload(20_000, "v2")
    client.put(f"{prefix}/v", old)
    with client.register(64 << 10) as region:
        first = client.get(f"{prefix}/v", region, 0, (0, 10_000))
        assert first.etag
        t = client.get(f"{prefix}/v", region, 10_000, (10_000, None), if_match=first.etag)
        assert t.bytes == 10_000 and region.read(0, 20_000) == old
        client.put(f"{prefix}/v", new)
        region.write(b"\xab" * 20_000, 0)
        with pytest.raises(sluice.PreconditionFailed):
            client.get(f"{prefix}/v", region, 0, (10_000, None), if_match=first.etag)
        [item] = client.get_many([sluice.GetSpec(f"{prefix}/v", region, 0, (0, 100), if_match=first.etag)])
        assert not item.ok and isinstance(item.error, sluice.PreconditionFailed), item
        assert region.read(0, 20_000) == b"\xab" * 20_000, "nothing was written"
        assert client.get(f"{prefix}/v", region).bytes == 20_000 and region.read(0, 20_000) == new
    with pytest.raises(TypeError):
        client.get(f"{prefix}/v", "r", if_match=b"etag")


def test_get_bytes_and_put_bytes_like(client, prefix):
    cases = {
        "bytes": b"plain bytes",
        "bytearray": bytearray(b"a bytearray"),
        "memoryview": memoryview(b"xx a memoryview xx")[3:-3],
        "numpy": np.arange(1000, dtype=np.uint16),
        "empty": b"",
    }
    for name, value in cases.items():
        client.put(f"{prefix}/{name}", value)
        expected = memoryview(value).cast("B").tobytes()
        assert client.get_bytes(f"{prefix}/{name}") == expected, name
        assert client.head(f"{prefix}/{name}").size == len(expected)
    client.put(f"{prefix}/slice", b"0123456789", 2, 5)
    assert client.get_bytes(f"{prefix}/slice") == b"23456"


def test_large_object_grows_scratch(client, prefix):
    data = payload(5 << 20, "big")  # bigger than the initial 1 MiB scratch region
    t = client.put(f"{prefix}/big", data)
    assert t.bytes == len(data)
    assert client.get_bytes(f"{prefix}/big") == data
    assert client.get_bytes(f"{prefix}/big", size_hint=len(data)) == data


def test_head(client, prefix):
    client.put(f"{prefix}/h", b"12345", content_type="text/plain")
    info = client.head(f"{prefix}/h")
    assert info == client.head(f"{prefix}/h")
    assert info.key == f"{prefix.split('/', 1)[1]}/h" and info.size == 5
    assert info.etag and info.content_type == "text/plain" and info.last_modified_unix_ms > 1_600_000_000_000


def test_list_iterates_pages(client, prefix):
    keys = [f"{prefix}/a/{i:02d}" for i in range(7)] + [f"{prefix}/b/x", f"{prefix}/b/y"]
    for i, k in enumerate(keys):
        client.put(k, payload(i + 1, k))
    rel = prefix.split("/", 1)[1]
    listed = list(client.list(prefix + "/", page_size=2))  # 5 pages
    assert [o.key for o in listed] == sorted(k.split("/", 1)[1] for k in keys)
    assert [o.size for o in listed] == [keys.index(f"data/{o.key}") + 1 for o in listed]
    assert [o.key for o in client.list(f"{prefix}/a/")] == [f"{rel}/a/{i:02d}" for i in range(7)]
    assert list(client.list(f"{prefix}/nothing-here/")) == []
    it = client.list(prefix + "/")
    assert next(it).key == f"{rel}/a/00"  # lazy iterator
    page = client.list_page(prefix + "/", delimiter="/")
    assert page.objects == [] and page.common_prefixes == [f"{rel}/a/", f"{rel}/b/"]
    page = client.list_page(prefix + "/", max_keys=3)
    assert len(page.objects) == 3 and page.next_continuation_token
    page2 = client.list_page(prefix + "/", page.next_continuation_token, 100)
    assert len(page2.objects) == 6 and page2.next_continuation_token == ""


def test_delete(client, prefix):
    client.put(f"{prefix}/d", b"x")
    client.delete(f"{prefix}/d")
    with pytest.raises(sluice.NoSuchKey):
        client.head(f"{prefix}/d")
    client.delete(f"{prefix}/d")  # deleting a missing key succeeds (S3 semantics)
    assert list(client.list(prefix)) == []


def test_stats_count_this_connection(stack):
    with sluice.Client(stack.socket) as c:
        before = c.stats()
        c.put("data/pytest-stats", b"abc")
        c.get_bytes("data/pytest-stats")
        with pytest.raises(sluice.NoSuchKey):
            c.head("data/pytest-stats-missing")
        after = c.stats()
        assert after.requests > before.requests
        assert after.bytes_written - before.bytes_written == 3
        assert after.bytes_read - before.bytes_read == 3
        assert after.errors == before.errors + 1
        assert after.regions >= 1 and after.registered_bytes >= 1 << 20  # the scratch region


def test_request_id_is_propagated(client, prefix):
    t = client.put(f"{prefix}/rid", b"x", request_id="pytest-put-1")
    assert t.request_id == "pytest-put-1"
    with client.register(4096) as region:
        assert client.get(f"{prefix}/rid", into=region, request_id="pytest-get-1").request_id == "pytest-get-1"
    with pytest.raises(sluice.NoSuchKey) as e:
        client.head(f"{prefix}/none", request_id="pytest-head-1")
    assert e.value.request_id == "pytest-head-1" and "pytest-head-1" in str(e.value)


def test_release_and_close_free_regions(stack):
    base, _ = stack.settled()
    c = sluice.Client(stack.socket)
    regions = [c.register(1 << 20) for _ in range(3)]
    assert stack.regions() == base + 3
    c.release(regions[0])
    assert regions[0].released and stack.regions() == base + 2
    c.release(regions[0])  # releasing a Region twice is a no-op
    with pytest.raises(sluice.UnknownRegion):
        c.release(regions[0].id)  # but the shim no longer knows the id
    view = regions[1].view  # a live view keeps the pages mapped after close
    c.close()
    assert c.closed and all(r.released for r in regions)
    assert stack.wait_for(lambda: stack.regions() == base), "closing the connection must release its regions"
    assert len(view) == 1 << 20
    with pytest.raises(sluice.RegionReleased):
        regions[1].numpy()
    with pytest.raises(sluice.ShimConnectionError):
        c.head("data/x")
    c.close()  # idempotent


def test_thread_safety_one_client_many_threads(client, prefix):
    objs = {f"{prefix}/t{i}": payload(2000 + i, i) for i in range(16)}
    for k, v in objs.items():
        client.put(k, v)
    errors = []

    def work(n):
        try:
            for i in range(20):
                k = f"{prefix}/t{(n + i) % 16}"
                assert client.get_bytes(k) == objs[k]
                assert client.head(k).size == len(objs[k])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_pipelined_registrations_with_descriptors_keep_their_descriptors(client, prefix):
    """Threads registering memory of their own (each Register frame carries
    its memfd) while others read: a read of the shim's can bring another
    request's frame and a Register's descriptor together, and handling the
    first must not close the second's descriptor (outside testing found
    3-7 of 600 such registrations refused)."""
    key = f"{prefix}/pipelined-register"
    client.put(key, b"x" * 4096)
    errors = []

    def register(n):
        try:
            for _ in range(60):
                region = client.register(4096, local=True)
                region.release()
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    def read(n):
        try:
            for _ in range(120):
                assert client.get_bytes(key) == b"x" * 4096
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=register, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=read, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_fork_needs_a_new_client(client, prefix):
    client.put(f"{prefix}/fork", b"parent")
    pid = os.fork()
    if pid == 0:  # child
        code = 1
        try:
            try:
                client.head(f"{prefix}/fork")
            except sluice.ShimConnectionError:
                with sluice.Client(client.socket_path) as mine:
                    code = 0 if mine.get_bytes(f"{prefix}/fork") == b"parent" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert client.get_bytes(f"{prefix}/fork") == b"parent"  # the parent's connection is intact


def test_scratch_regions_are_reused_or_released(stack, prefix):
    base, _ = stack.settled()
    with sluice.Client(stack.socket) as c:
        c.put(f"{prefix}/s", b"scratch")
        assert c.get_bytes(f"{prefix}/s") == b"scratch"
        # one scratch region per path (put's; get_bytes' on the native
        # path, which has a connection of its own), reused
        first = c.stats().regions
        assert first == (2 if c._native is not None else 1)
        for _ in range(20):
            assert c.get_bytes(f"{prefix}/s") == b"scratch"
        assert c.stats().regions == first
    with sluice.Client(stack.socket, scratch_bytes=0) as c:  # keep none
        for _ in range(5):
            assert c.get_bytes(f"{prefix}/s") == b"scratch"
        assert stack.wait_for(lambda: c.stats().regions == 0), c.stats()
    assert stack.wait_for(lambda: stack.regions() == base)
