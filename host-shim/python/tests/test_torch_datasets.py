"""sluice.torch: the datasets' machinery works without torch; with torch
installed, they also run inside a DataLoader with worker processes."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

import sluice
import sluice.torch as st
from _helpers import digest, iterate_shard, payload


@pytest.fixture
def corpus(client, prefix):
    objs = {f"{prefix}/s{i:02d}": payload(1000 + 311 * i, ("ds", i)) for i in range(11)}
    for k, v in objs.items():
        client.put(k, v)
    client.put(f"{prefix}-other/x", b"not under the prefix")
    return objs


def test_module_imports_without_torch():
    assert isinstance(st.HAVE_TORCH, bool)
    assert st.worker_info() == (0, 1)  # not inside a DataLoader worker


def test_map_dataset(stack, corpus, prefix):
    ds = st.ShimDataset(prefix + "/", stack.socket)
    paths = sorted(corpus)
    assert len(ds) == len(corpus) and [ds.path(i) for i in range(len(ds))] == paths
    assert ds[0] == corpus[paths[0]] and ds[-1] == corpus[paths[-1]]
    with pytest.raises(IndexError):
        ds[len(ds)]
    batch = ds.__getitems__([3, 1, 3])
    assert batch == [corpus[paths[3]], corpus[paths[1]], corpus[paths[3]]]
    ds2 = st.ShimDataset(prefix + "/", stack.socket, transform=len, return_path=True)
    assert ds2[2] == (paths[2], len(corpus[paths[2]]))
    # Readahead for sequential access returns the same data.
    ahead = st.ShimDataset(prefix + "/", stack.socket, readahead=3)
    assert [ahead[i] for i in range(len(ahead))] == [corpus[p] for p in paths]
    assert [ahead[i] for i in (5, 0, 9)] == [corpus[paths[i]] for i in (5, 0, 9)]  # random access too
    # Picklable (spawned DataLoader workers get a copy).
    copy = pickle.loads(pickle.dumps(ahead))
    assert copy.items == ahead.items and copy[4] == corpus[paths[4]]


def test_map_dataset_errors_are_typed(stack, corpus, prefix):
    ds = st.ShimDataset(prefix, stack.socket, paths=[sorted(corpus)[0], f"{prefix}/gone"])
    assert ds[0] == corpus[sorted(corpus)[0]]
    with pytest.raises(sluice.NoSuchKey):
        ds[1]
    with pytest.raises(sluice.NoSuchKey):
        ds.__getitems__([0, 1])


def test_iterable_dataset_shards_and_prefetches(stack, corpus, prefix):
    ds = st.ShimIterableDataset(prefix + "/", stack.socket, prefetch=4, return_path=True)
    got = list(ds)
    assert [p for p, _ in got] == sorted(corpus) and all(d == corpus[p] for p, d in got)
    # Three workers: disjoint shards that cover everything.
    shards = [ds.shard(w, 3) for w in range(3)]
    flat = [p for s in shards for p, _ in s]
    assert sorted(flat) == sorted(corpus) and len(set(flat)) == len(flat)
    # Two ranks x two workers.
    ranks = [st.ShimIterableDataset(prefix + "/", stack.socket, rank=r, world_size=2) for r in range(2)]
    flat = [p for d in ranks for w in range(2) for p, _ in d.shard(w, 2)]
    assert sorted(flat) == sorted(corpus) and len(set(flat)) == len(flat)
    # Shuffle: a permutation per epoch, the same in every worker.
    sh = st.ShimIterableDataset(prefix + "/", stack.socket, shuffle=True, seed=1)
    e0 = [p for p, _ in sh.shard(0, 1)]
    sh.set_epoch(1)
    e1 = [p for p, _ in sh.shard(0, 1)]
    assert sorted(e0) == sorted(e1) == sorted(corpus) and e0 != e1
    assert [p for p, _ in sh.shard(0, 1)] == e1


def test_iterable_dataset_in_worker_processes(stack, corpus, prefix):
    """Emulates DataLoader workers: each process reads its shard over its own connection."""
    ds = st.ShimIterableDataset(prefix + "/", stack.socket, prefetch=3, return_path=True)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        outs = pool.map(iterate_shard, [(ds, w, 3) for w in range(3)])
    flat = [x for o in outs for x in o]
    assert sorted(flat) == sorted((p, digest(d)) for p, d in corpus.items())
    assert [p for p, _ in outs[1]] == [p for p, _ in ds.shard(1, 3)]


def test_iterable_dataset_errors(stack, corpus, prefix):
    paths = sorted(corpus)[:2] + [f"{prefix}/gone"]
    with pytest.raises(sluice.NoSuchKey):
        list(st.ShimIterableDataset(prefix, stack.socket, paths=paths))
    skip = st.ShimIterableDataset(prefix, stack.socket, paths=paths, on_error="skip")
    assert list(skip) == [corpus[p] for p in paths[:2]]
    results = list(st.ShimIterableDataset(prefix, stack.socket, paths=paths).results())
    assert [r.ok for r in results] == [True, True, False]


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")
def test_worker_client_is_per_process(stack):
    a = st.worker_client(stack.socket)
    assert st.worker_client(stack.socket) is a
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            b = st.worker_client(stack.socket)
            code = 0 if b is not a and b.stats() is not None else 2
        finally:
            os._exit(code)
    os.close(w)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert a.stats() is not None  # the parent's is untouched


def test_dataloader_with_workers_if_torch_installed(stack, corpus, prefix):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    paths = sorted(corpus)
    ds = st.ShimDataset(prefix + "/", stack.socket, transform=lambda b: torch.tensor(len(b)))
    assert isinstance(ds, torch.utils.data.Dataset)
    lengths = [int(x) for batch in DataLoader(ds, batch_size=4, num_workers=2) for x in batch]
    assert lengths == [len(corpus[p]) for p in paths]
    it = st.ShimIterableDataset(prefix + "/", stack.socket, return_path=True)
    assert isinstance(it, torch.utils.data.IterableDataset)
    seen = [path for path, _ in DataLoader(it, batch_size=None, num_workers=2)]
    assert sorted(seen) == paths
    # Spawned workers get a pickled copy of the dataset and connect on their own.
    loader = DataLoader(it, batch_size=3, num_workers=2, multiprocessing_context="spawn")
    seen = {path: data for batch_paths, batch_data in loader for path, data in zip(batch_paths, batch_data)}
    assert seen == corpus
