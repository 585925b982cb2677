"""State dicts in registered memory for :mod:`sluice.dcp`: tensors that live
in memory registered with the shim are stored from, and loaded into, their
own memory with no copy on this host (re-exported by :mod:`sluice.dcp`)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

try:
    import torch
except ImportError:  # pragma: no cover - without torch the module still imports
    pass

__all__ = ["register_state_dict", "release_registered_state"]


def _client_of(client: Any) -> Any:
    if client is None or isinstance(client, str):
        from .client import Client

        return Client(client)
    return client


def _registered_home(client: Any, t: Any, nbytes: int) -> Optional[Tuple[Any, int]]:
    """(region, offset) of a contiguous CPU tensor that lives in memory the
    client registered, else None."""
    region_at = getattr(client, "region_at", None)
    if region_at is None or not nbytes or t.is_cuda or not t.is_contiguous():
        return None
    return region_at(t.data_ptr(), nbytes)


def register_state_dict(state_dict: Any, client: Any = None, *, region_bytes: int = 1 << 30) -> Any:
    """A copy of ``state_dict`` whose CPU tensors live in memory registered
    with the shim (regions of up to ``region_bytes``; a bigger tensor gets
    its own): :func:`save` then stores them, and :func:`load` reads into
    them, with no copy on this host. Tensors are copied in once, here;
    everything else is kept as is.

    Keep the model in that memory to checkpoint it again and again without
    copies, e.g. ``model.load_state_dict(register_state_dict(model.state_dict(),
    client), assign=True)``. The regions belong to ``client`` and go when it
    closes, or with :func:`release_registered_state`): register a state
    once, not per checkpoint."""
    client = _client_of(client)
    tensors: List[Any] = []
    _collect(state_dict, tensors)
    views: Dict[int, Any] = {}
    batch: List[Any] = []
    total = 0

    # The client keeps the regions: tensors hold only the mapping, and a
    # region nobody holds would be released under them.
    held: List[Any] = client.__dict__.setdefault("_registered_state", [])

    def place(batch: List[Any], total: int) -> None:
        region = client.register(max(total, 1))
        held.append(region)
        off = 0
        for t in batch:
            n = t.numel() * t.element_size()
            view = region.torch(torch.uint8, n, off).view(t.dtype).view(t.shape)
            view.copy_(t)
            views[id(t)] = view
            off += (n + 63) & ~63

    for t in tensors:
        n = (t.numel() * t.element_size() + 63) & ~63
        if batch and total + n > region_bytes:
            place(batch, total)
            batch, total = [], 0
        batch.append(t)
        total += n
    if batch:
        place(batch, total)
    return _substitute(state_dict, views)


def release_registered_state(client: Any = None) -> None:
    """Releases the regions of every state dict :func:`register_state_dict`
    made on ``client``; their tensors must no longer be used."""
    client = _client_of(client)
    for region in client.__dict__.pop("_registered_state", []):
        region.release()


def _collect(obj: Any, out: List[Any]) -> None:
    if isinstance(obj, torch.Tensor):
        if not obj.is_cuda and obj.numel() and obj.layout == torch.strided:
            out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect(v, out)


def _substitute(obj: Any, views: Dict[int, Any]) -> Any:
    if isinstance(obj, torch.Tensor):
        v = views.get(id(obj))
        if v is None:
            return obj
        return torch.nn.Parameter(v, requires_grad=obj.requires_grad) if isinstance(obj, torch.nn.Parameter) else v
    if isinstance(obj, dict):
        items = [(k, _substitute(v, views)) for k, v in obj.items()]
        try:
            return type(obj)(items)  # OrderedDict and friends keep their type
        except TypeError:
            return dict(items)
    if isinstance(obj, list):
        return [_substitute(v, views) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_substitute(v, views) for v in obj)
    return obj
