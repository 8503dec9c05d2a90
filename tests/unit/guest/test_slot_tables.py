"""A request slot's plain indirect table (guest/frontend/driver.py): a request whose
command and response are all of its chain writes its slot's plain table once and, while
the slot's next such requests have a command of the same size, publishes it again
unchanged (DriverQueue.add_indirect); a command of another size writes it anew, and a
request with data extents uses the slot's other table, leaving it valid. The device must
see each request's own chain. Sans-IO: the real driver over test_kick_policy's inline
loopback device, which applies the kick's patches, so a table not rewritten is one it
already has."""

from pvgpu.guest.frontend.driver import SLOT_RESP, command
from pvgpu.spec import wire

from test_kick_policy import session  # noqa: F401  (the fixture)

DATA = 1 << 20  # guest memory a request's data extent points at


def test_each_request_reaches_the_device_with_its_own_chain(session, monkeypatch):  # noqa: F811
    drv, ch = session.devices[0], session.channel
    seen, pop = [], ch.device_queue.pop

    def recording_pop():
        chain = pop()
        if chain is not None:
            seen.append(([n for _g, n in chain.readable], [n for _g, n in chain.writable]))
        return chain
    monkeypatch.setattr(ch.device_queue, "pop", recording_pop)
    tables, add_indirect = [], drv.queue.add_indirect
    monkeypatch.setattr(drv.queue, "add_indirect",
                        lambda *a: tables.append(a) or add_indirect(*a))
    nop, free = command(wire.CMD_NOP), command(wire.CMD_MEM_FREE, (5,))
    assert len(nop) != len(free)
    slots = []
    for cmd, readable in [(nop, ()), (nop, ()), (nop, [(DATA, 16)]), (nop, ()), (free, ()),
                          (nop, ()), (nop, ())]:
        req = drv.submit(cmd, readable)
        slots.append(req.slot)
        assert drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert len(set(slots)) == 1  # one slot, reused each time
    assert seen == [([24], [SLOT_RESP]), ([24], [SLOT_RESP]), ([24, 16], [SLOT_RESP]),
                    ([24], [SLOT_RESP]), ([32], [SLOT_RESP]), ([24], [SLOT_RESP]),
                    ([24], [SLOT_RESP])]
    assert len(tables) == 3  # the 2nd, 4th and last NOP: the table their slot held
