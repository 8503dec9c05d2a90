"""The public entry of the guest API: `api` wraps one public method of the API's classes so
that it runs under the connection lock (`_conn_lock`, an RLock) — the frontend a
connection's objects share (rings, request slots, guest memory heap, bounce chunks) is not
thread-safe, and several threads may share a connection — frees what became garbage at
the outermost call (guest/api/lifetime.py), and re-raises frontend and transport errors
as the API's exceptions. Every public method that reaches the driver, the guest memory
heap or state they change is wrapped (tests check it).
"""

from __future__ import annotations

import functools

from guest.api import errors


def api(fn):
    """One API call on `self` (an object of the API, or the context or device a module-level
    call takes first): serialized per connection, with frontend/transport errors re-raised
    as the API's exceptions."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        lock = self._conn_lock
        outermost = not lock._is_owned()
        with lock:
            try:
                if outermost:  # a safe point: free what became garbage (guest/api/lifetime.py)
                    self._releases.drain()
                return fn(self, *args, **kwargs)
            except errors.PvgpuError:
                raise
            except Exception as e:
                mapped = errors.translate(e)
                if mapped is e:
                    raise
                if isinstance(mapped, (errors.PageFaultError, errors.IllegalCodeError)):
                    _claim_fault_event(self, mapped)
                raise mapped from None
    wrapper.api_locked = True
    return wrapper


def _fault_scope(obj) -> tuple:
    """-> (device, ctx_id or None): whose fault events (spec §5.7) a page fault or code
    fault raised by obj's call claims (a device or a context says so itself; other objects
    ask their context, else their device); a ctx_id of None claims by address."""
    own = getattr(obj, "_fault_scope", None)
    if own is not None:
        return own()
    for owner in (getattr(obj, "context", None), getattr(obj, "device", None)):
        if hasattr(owner, "_fault_scope"):
            return owner._fault_scope()
    return None, None


def _claim_fault_event(obj, err) -> None:
    """Attach the event-queue entry of a fault (spec §5.7) to the PageFaultError (or
    IllegalCodeError) raised for it. Every fault event of the same context received so far
    counts as reported with it (one operation, e.g. a chunked copy, may fault in several
    jobs), so a later synchronize does not raise them again."""
    device, ctx_id = _fault_scope(obj)
    if device is None:
        return
    same = (lambda ev: ev.ctx_id == ctx_id) if ctx_id is not None else \
        (lambda ev: ev.address == err.address)
    claimed = device._claim_faults(same)
    err.event = next((ev for ev in claimed if ev.address == err.address),
                     claimed[0] if claimed else None)
