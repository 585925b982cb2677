"""Operations as generators, and what drives them.

An operation does no I/O: it yields a batch of :class:`Call`\\ s and
receives, in the same order, one outcome per call (a :class:`Reply`, or the
:class:`~sluice.SluiceError` for that call). :func:`one` makes one call,
:func:`all_of` runs several operations side by side, :func:`drive_step`
advances one for a driver (``_core``'s clients).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Generator, List, Optional, Tuple, TypeVar, Union

from .errors import ProtocolError, SluiceError


@dataclass
class Call:
    """One request to send: the ``Request.op`` member, its fields, and an
    optional descriptor to attach (SCM_RIGHTS)."""

    op: str
    fields: Dict[str, Any]
    fd: Optional[int] = None
    request_id: str = ""


@dataclass
class Reply:
    """A successful response: the ``Response.result`` member and its fields,
    plus the descriptor that came with it (``Registered`` only)."""

    id: int
    request_id: str
    kind: str
    body: Dict[str, Any]
    fd: Optional[int] = None


Outcome = Union[Reply, SluiceError]
T = TypeVar("T")
Op = Generator[List[Call], List[Outcome], T]


def one(call: Call, expect: str) -> "Op[Reply]":
    """Sends one call; returns its reply (of kind ``expect``) or raises its error."""
    (out,) = yield [call]
    return check(out, expect)


def check(out: Outcome, expect: str) -> Reply:
    if isinstance(out, BaseException):
        raise out
    if out.kind != expect:
        close_fd(out.fd)
        raise ProtocolError(f"expected a {expect} response, got {out.kind}", request_id=out.request_id)
    return out


def close_fd(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass




def all_of(ops: "List[Op[Any]]") -> "Op[List[Any]]":
    """Runs several operations side by side in one: each round sends every
    call they are waiting to make together, and gives each its own answers.
    Returns their results in order; an operation that raises a
    :class:`SluiceError` has it as its result (the others go on). If this
    operation is abandoned, every one not finished is closed (their
    ``finally`` blocks run)."""
    results: List[Any] = [None] * len(ops)
    waiting: Dict[int, List[Call]] = {}

    def step(i: int, outs: Optional[List[Outcome]]) -> None:
        try:
            done, val = drive_step(ops[i], outs)
        except SluiceError as e:
            done, val = True, e
        if done:
            results[i] = val
            waiting.pop(i, None)
        else:
            waiting[i] = list(val)

    try:
        for i in range(len(ops)):
            step(i, None)
        while waiting:
            order = sorted(waiting)
            calls = [c for i in order for c in waiting[i]]
            outs = yield calls
            at = 0
            for i in order:
                n = len(waiting[i])
                step(i, list(outs[at : at + n]))
                at += n
        return results
    finally:
        for i in list(waiting):
            ops[i].close()


def drive_step(gen: "Op[T]", outcomes: Optional[List[Outcome]]) -> Tuple[bool, Any]:
    """Advances ``gen``: returns (True, result) when it finished, else
    (False, next batch of calls). Exceptions propagate."""
    try:
        calls = next(gen) if outcomes is None else gen.send(outcomes)
    except StopIteration as stop:
        return True, stop.value
    return False, calls
