"""get_many: pipelined, per-item results; iter_get: prefetching reads."""

from __future__ import annotations

import pytest

import sluice
from _helpers import payload


@pytest.fixture
def objs(client, prefix):
    data = {f"{prefix}/o{i}": payload(100 + 997 * i, i) for i in range(6)}
    for k, v in data.items():
        client.put(k, v)
    return data


def test_mixed_good_and_bad_items(client, prefix, objs):
    keys = list(objs)
    region = client.register(64 << 10)
    tiny = client.register(16)
    dead = client.register(4096)
    client.release(dead)
    items = [
        keys[0],  # bytes
        f"{prefix}/missing",  # NoSuchKey
        "nope/key",  # UnknownNamespace
        "data",  # malformed path
        sluice.GetSpec(keys[1], into=region, offset=128),  # into a region
        (keys[2], None, 0, (10, 20)),  # tuple form, a range
        sluice.GetSpec(keys[3], into=tiny),  # does not fit
        sluice.GetSpec(keys[4], into=dead),  # released region
        sluice.GetSpec(keys[5], range=(5, None)),
        (keys[2], None, 0, (10**9, None)),  # unsatisfiable range
        keys[0],  # the same key twice
    ]
    res = client.get_many(items)
    assert [r.index for r in res] == list(range(len(items)))
    assert [r.path for r in res] == [sluice.types.as_spec(i).path for i in items]
    assert [r.ok for r in res] == [True, False, False, False, True, True, False, False, True, False, True]
    expect_errors = {
        1: sluice.NoSuchKey,
        2: sluice.UnknownNamespace,
        3: sluice.BadRequest,
        6: sluice.RegionTooSmall,
        7: sluice.UnknownRegion,
        9: sluice.InvalidRange,
    }
    for i, r in enumerate(res):
        if i in expect_errors:
            assert isinstance(r.error, expect_errors[i]), (i, r.error)
            assert r.error.code is expect_errors[i].CODE
            assert r.data is None and r.nbytes == 0 and r.transfer is None and r.data_path is None
            with pytest.raises(expect_errors[i]):
                r.unwrap()
        else:
            assert r.error is None and r.transfer is not None
            assert r.data_path in ("http", "rdma", "rdma-staged") and r.transport == r.data_path
            assert r.fallback_reason == "" and r.request_id
    assert res[0].data == objs[keys[0]] and res[0].nbytes == len(objs[keys[0]])
    assert res[10].data == objs[keys[0]]
    assert res[4].data is None and res[4].nbytes == len(objs[keys[1]])
    assert region.read(128, res[4].nbytes) == objs[keys[1]]
    assert res[5].data == objs[keys[2]][10:30] and res[5].transfer.object_size == len(objs[keys[2]])
    assert res[8].data == objs[keys[5]][5:]
    assert bytes(tiny.read()) == b"\0" * 16  # the refused item wrote nothing


def test_a_batch_is_one_request(client, objs, monkeypatch):
    """A get_many is one GetBatch request (items into regions and bytes
    items alike), with no HEAD before it: bytes items go into scratch slots
    of a guessed size. (The Python path's framing: the native reader, which
    would take the region-only list, is set aside.)"""
    monkeypatch.setattr(client, "_native", None)
    events = []
    submit, wait = client._submit, client._wait

    def spy_submit(call, wait=True):
        events.append(("send", call.op, len(call.fields.get("items", ()))))
        return submit(call, wait)

    def spy_wait(fut):
        events.append(("wait", None, 0))
        return wait(fut)

    client._submit, client._wait = spy_submit, spy_wait
    try:
        keys = list(objs)
        with client.register(1 << 20) as region:
            specs = [sluice.GetSpec(k, into=region, offset=i * 8192) for i, k in enumerate(keys)]
            events.clear()
            res = client.get_many(specs)
            assert all(r.ok for r in res)
            assert events == [("send", "get_batch", len(keys)), ("wait", None, 0)]
            for i, k in enumerate(keys):
                assert region.read(i * 8192, res[i].nbytes) == objs[k]
            events.clear()
            res = client.get_many(keys + specs[:2])
            assert [r.data for r in res[: len(keys)]] == list(objs.values())
            assert [r.nbytes for r in res[len(keys) :]] == [len(objs[k]) for k in keys[:2]]
            # (The first use of scratch memory registers it; nothing else.)
            assert events[-2:] == [("send", "get_batch", len(keys) + 2), ("wait", None, 0)], events
            assert events[:-2] in ([], [("send", "register", 0), ("wait", None, 0)]), events
    finally:
        del client._submit, client._wait


def test_items_bigger_than_their_slot_are_read_again_at_their_size(stack, prefix):
    """An object bigger than the guessed slot fails its item with
    REGION_TOO_SMALL and the size it needs, and is read again at that size
    in a second batch: still no HEAD. (The Python path's requests; the
    native path's are in test_native_reads.py.)"""
    with sluice.Client(stack.socket, native=False) as c:
        small = {f"{prefix}/s{i}": payload(1000, ("s", i)) for i in range(3)}
        big = {f"{prefix}/g{i}": payload((1536 << 10) + i, ("g", i)) for i in range(2)}
        for k, v in {**small, **big}.items():
            c.put(k, v)
        ops = []
        submit = c._submit

        def spy_submit(call, wait=True):
            ops.append((call.op, len(call.fields.get("items", ()))))
            return submit(call, wait)

        c._submit = spy_submit
        try:
            keys = list(small) + list(big)
            res = c.get_many(keys)
            assert [r.data for r in res] == list(small.values()) + list(big.values())
            ops = [o for o in ops if o[0] != "register"]
            assert ops == [("get_batch", 5), ("get_batch", 2)], ops
            # The next batch's slots are sized from what was seen: one request.
            ops.clear()
            res = c.get_many(list(big))
            assert [r.data for r in res] == list(big.values())
            assert [o for o in ops if o[0] != "register"] == [("get_batch", 2)], ops
            # get_bytes learns the size from the shim too (no HEAD).
            ops.clear()
            c._size_guess = 4096
            assert c.get_bytes(keys[-1]) == big[keys[-1]]
            assert [op for op, _ in ops if op != "register"] == ["get", "get"], ops
        finally:
            del c._submit


def test_many_more_items_than_the_shims_in_flight_limit(client, prefix):
    client.put(f"{prefix}/x", b"0123456789")
    res = client.get_many([(f"{prefix}/x", None, 0, (i % 10, 1)) for i in range(600)])
    assert [r.data for r in res] == [bytes([48 + i % 10]) for i in range(600)]


def test_several_scratch_batches(stack, prefix):
    with sluice.Client(stack.socket, get_many_batch_bytes=300 << 10) as c:
        data = {f"{prefix}/b{i}": payload(200 << 10, ("b", i)) for i in range(5)}
        for k, v in data.items():
            c.put(k, v)
        res = c.get_many(list(data) + [f"{prefix}/none"])
        assert [r.data for r in res[:-1]] == list(data.values())
        assert isinstance(res[-1].error, sluice.NoSuchKey)


def test_empty(client):
    assert client.get_many([]) == []
    with pytest.raises(TypeError):
        client.get_many([42])


def test_iter_get_prefetches_in_order(client, objs, prefix):
    keys = list(objs)
    items = keys + [f"{prefix}/missing"] + [(keys[0], len(objs[keys[0]]))]
    out = list(client.iter_get(items, prefetch=3))
    assert [r.path for r in out] == keys + [f"{prefix}/missing", keys[0]]
    assert [r.data for r in out[: len(keys)]] == list(objs.values())
    assert isinstance(out[len(keys)].error, sluice.NoSuchKey)
    assert out[-1].data == objs[keys[0]]
    # Abandoning the iterator early leaves the connection usable.
    it = client.iter_get(keys, prefetch=4)
    assert next(it).data == objs[keys[0]]
    it.close()
    assert client.get_bytes(keys[1]) == objs[keys[1]]


def test_iter_get_grows_for_big_objects(client, prefix):
    big = payload(3 << 20, "iter-big")
    client.put(f"{prefix}/big", big)
    out = list(client.iter_get([f"{prefix}/big"] * 3, prefetch=2))
    assert all(r.ok and r.data == big for r in out)


def _registers(c, fn):
    """Runs ``fn()``; returns how many regions the client registered meanwhile."""
    n = []
    submit = c._submit

    def spy(call, wait=True):
        n.extend([1] if call.op == "register" else [])
        return submit(call, wait)

    c._submit = spy
    try:
        fn()
    finally:
        del c._submit
    return len(n)


def test_copy_false_lends_scratch_memory_until_the_views_are_gone(stack, prefix):
    with sluice.Client(stack.socket) as c:
        a, b = payload(300 << 10, "a"), payload(5000, "b")
        c.put(f"{prefix}/a", a)
        c.put(f"{prefix}/b", b)
        view = c.get_bytes(f"{prefix}/a", copy=False)
        assert isinstance(view, memoryview) and view.readonly and view.nbytes == len(a)
        assert view == a
        # The lent memory is not reused while the view lives: later reads
        # go elsewhere and leave it alone.
        for _ in range(3):
            assert c.get_bytes(f"{prefix}/b") == b
            assert [r.data for r in c.get_many([f"{prefix}/b"] * 4)] == [b] * 4
        part = view[10:20]
        del view
        assert part == a[10:20], "a slice keeps the lent memory too"
        # Once every view is gone, the memory goes back to the pool and is
        # reused: no new registration for the next reads.
        del part
        c.get_bytes(f"{prefix}/b")  # returns what was lent
        assert _registers(c, lambda: [c.get_bytes(f"{prefix}/a") for _ in range(3)]) == 0

        res = c.get_many([f"{prefix}/a", f"{prefix}/missing", f"{prefix}/b"], copy=False)
        assert [type(r.data) for r in res] == [memoryview, type(None), memoryview]
        assert res[0].data == a and res[2].data == b and isinstance(res[1].error, sluice.NoSuchKey)
        with pytest.raises(TypeError):
            res[0].data[0] = 1  # read-only
        kept = res[2].data
        del res
        assert [r.data for r in c.get_many([f"{prefix}/a"] * 3)] == [a] * 3
        assert kept == b
    # A view outlives its client (closed: regions released at the shim); its
    # memory stays mapped here until the view goes.
    assert kept == b and bytes(kept[:5]) == b[:5]
    del kept

