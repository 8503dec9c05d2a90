"""The public entry of the guest API: every public method and property of the API's
classes runs under the connection lock, by construction.

The frontend a connection's objects share (rings, request slots, guest memory heap, bounce
chunks) is not thread-safe, and several threads may share a connection. So the API's
classes derive from `ApiObject`, whose `__init_subclass__` wraps every public method and
property (getter, setter, deleter) the class defines with `api`: the call takes the
connection lock (`_conn_lock`, an RLock), the outermost call first frees what became
garbage (guest/api/lifetime.py), and frontend and transport errors are re-raised as the
API's exceptions. A member that must not or need not take the lock says why with
`@unlocked("reason")`; nothing public is left to a convention.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import TYPE_CHECKING

from pvgpu.guest.api import errors

if TYPE_CHECKING:
    from pvgpu.guest.api.lifetime import Releases


def unlocked(reason: str):
    """Mark a public method (or a property's getter) that runs without the connection
    lock; `reason` says why that is safe."""
    if not reason:
        raise ValueError("an unlocked API member needs its reason")

    def mark(fn):
        fn.unlocked_reason = reason
        return fn
    return mark


def api(fn):
    """One API call on `self` (an ApiObject): serialized per connection, with
    frontend/transport errors re-raised as the API's exceptions."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        lock = self._conn_lock
        outermost = not lock._is_owned()
        with lock:
            try:
                if outermost:  # a safe point: free what became garbage (guest/api/lifetime.py)
                    self._releases.drain()
                return fn(self, *args, **kwargs)
            except Exception as e:
                if self._releases.connection.session.closed:
                    raise errors.ConnectionClosedError(
                        "the connection is closed: open a new one with connect()") from None
                mapped = errors.translate(e)
                if mapped is e:
                    raise
                if isinstance(mapped, (errors.PageFaultError, errors.IllegalCodeError)):
                    _claim_fault_event(self, mapped)
                raise mapped from None
    wrapper.api_locked = True  # type: ignore[attr-defined]
    return wrapper


def covered(attr):
    """`attr` (a class attribute) as the API exposes it: a function wrapped by `api` unless
    it is marked `unlocked` (or wrapped already), a property with its accessors treated so;
    anything else as it is. A public static or class method has no connection: it must
    say so with `unlocked`."""
    if isinstance(attr, property):
        acc = [a if a is None else covered(a) for a in (attr.fget, attr.fset, attr.fdel)]
        if acc == [attr.fget, attr.fset, attr.fdel]:
            return attr
        return property(acc[0], acc[1], acc[2], attr.__doc__)
    if isinstance(attr, (staticmethod, classmethod)):
        if not hasattr(attr.__func__, "unlocked_reason"):
            raise TypeError(f"public {type(attr).__name__} {attr.__func__.__qualname__} of an "
                            "API class has no connection to lock: mark it @unlocked(reason)")
        return attr
    if inspect.isfunction(attr):
        if getattr(attr, "api_locked", False) or hasattr(attr, "unlocked_reason"):
            return attr
        return api(attr)
    return attr


class ApiObject:
    """Base of the API's classes: their public methods and properties take the connection
    lock (module docstring). An instance has `_conn_lock` and `_releases` of its
    connection."""

    _conn_lock: threading.RLock
    _releases: Releases

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, attr in list(vars(cls).items()):
            if name.startswith("_"):
                continue
            new = covered(attr)
            if new is not attr:
                setattr(cls, name, new)

    def _fault_scope(self) -> tuple:
        """-> (device, ctx_id or None): whose fault events (spec §5.7) a page fault or code
        fault raised by this object's call claims; a ctx_id of None claims by address."""
        for owner in (getattr(self, "context", None), getattr(self, "device", None)):
            if isinstance(owner, ApiObject):
                return owner._fault_scope()
        return None, None


def _claim_fault_event(obj, err) -> None:
    """Attach the event-queue entry of a fault (spec §5.7) to the PageFaultError (or
    IllegalCodeError) raised for it. Every fault event of the same context received so far
    counts as reported with it (one operation, e.g. a chunked copy, may fault in several
    jobs), so a later synchronize does not raise them again."""
    device, ctx_id = obj._fault_scope() if isinstance(obj, ApiObject) else (None, None)
    if device is None:
        return
    same = (lambda ev: ev.ctx_id == ctx_id) if ctx_id is not None else \
        (lambda ev: ev.address == err.address)
    claimed = device._claim_faults(same)
    err.event = next((ev for ev in claimed if ev.address == err.address),
                     claimed[0] if claimed else None)
