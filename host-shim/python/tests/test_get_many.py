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


def test_requests_are_pipelined(client, objs):
    """All requests of a batch are on the wire before the first answer is awaited."""
    events = []
    submit, wait = client._submit, client._wait

    def spy_submit(call, wait=True):
        events.append(("send", call.op))
        return submit(call, wait)

    def spy_wait(fut):
        events.append(("wait", None))
        return wait(fut)

    client._submit, client._wait = spy_submit, spy_wait
    try:
        keys = list(objs)
        with client.register(1 << 20) as region:
            specs = [sluice.GetSpec(k, into=region, offset=i * 8192) for i, k in enumerate(keys)]
            events.clear()
            res = client.get_many(specs)
            assert all(r.ok for r in res)
            assert events[: len(keys)] == [("send", "get")] * len(keys)
            assert events[len(keys)][0] == "wait"
            # Bytes items: one pipelined batch of HEADs, then one of GETs.
            events.clear()
            res = client.get_many(keys)
            assert [r.data for r in res] == list(objs.values())
            sends = [op for kind, op in events if kind == "send"]
            assert sends[: len(keys)] == ["head"] * len(keys)
            assert sends[-len(keys) :] == ["get"] * len(keys)
            first_wait = next(i for i, (kind, _) in enumerate(events) if kind == "wait")
            assert first_wait == len(keys)
    finally:
        del client._submit, client._wait


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
