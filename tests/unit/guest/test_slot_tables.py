"""A request slot's indirect tables (guest/frontend/driver.py). A request whose command
and response are all of its chain writes its slot's plain table once and, while the
slot's next such requests have a command of the same size, publishes it again unchanged
(DriverQueue.add_indirect); a command of another size writes it anew. A request with data
extents uses the slot's other table, leaving the plain one valid, and publishes it again
for a request of the same command size and extents (given as tuples: a list could change
under the driver). The device must see each request's own chain. Sans-IO: the real driver
over test_kick_policy's inline loopback device, which applies the kick's patches, so a
table not rewritten is one it already has."""

from pvgpu.guest.frontend.driver import SLOT_RESP, command
from pvgpu.spec import wire

from test_kick_policy import session  # noqa: F401  (the fixture)

DATA = 1 << 20  # guest memory a request's data extent points at


def recorded(session, monkeypatch) -> tuple:
    """-> (the chains the device pops, as (readable lens, writable lens); the tables the
    driver publishes again), appended to as requests go out."""
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
    return seen, tables


def run(drv, requests) -> None:
    slots = []
    for cmd, readable, writable in requests:
        req = drv.submit(cmd, readable, writable)
        slots.append(req.slot)
        assert drv.wait(req) == (wire.RESP_OK_NODATA, b"")
    assert len(set(slots)) == 1  # one slot, reused each time


def test_each_request_reaches_the_device_with_its_own_chain(session, monkeypatch):  # noqa: F811
    drv = session.devices[0]
    seen, tables = recorded(session, monkeypatch)
    nop, free = command(wire.CMD_NOP), command(wire.CMD_MEM_FREE, (5,))
    assert len(nop) != len(free)
    run(drv, [(nop, (), ()), (nop, (), ()), (nop, [(DATA, 16)], ()), (nop, (), ()),
              (free, (), ()), (nop, (), ()), (nop, (), ())])
    assert seen == [([24], [SLOT_RESP]), ([24], [SLOT_RESP]), ([24, 16], [SLOT_RESP]),
                    ([24], [SLOT_RESP]), ([32], [SLOT_RESP]), ([24], [SLOT_RESP]),
                    ([24], [SLOT_RESP])]
    assert len(tables) == 3  # the 2nd, 4th and last NOP: the table their slot held
    assert all(n == 2 for _table, n, _wlen in tables)


def test_requests_with_the_same_extents_publish_their_table_again(session, monkeypatch):  # noqa: F811
    drv = session.devices[0]
    seen, tables = recorded(session, monkeypatch)
    nop = command(wire.CMD_NOP)
    pad = wire.MIN_RESPONSE_SIZE - wire.CTRL_HDR_SIZE - 64
    extent = [DATA, 32]  # a list: it may change between two requests
    run(drv, [(nop, [(DATA, 16)], ()), (nop, [(DATA, 16)], ()),  # again
              (nop, [(DATA, 32)], ()), (nop, [(DATA, 32)], ()),  # other extents, then again
              (nop, [extent], ())])
    extent[1] = 48
    run(drv, [(nop, [extent], ()), (nop, [(DATA, 48)], ()),
              (nop, (), ()), (nop, [(DATA, 48)], ()),  # a plain request in between
              (nop, (), [(DATA, 64)]), (nop, (), [(DATA, 64)])])  # writable extents
    assert seen == [([24, 16], [SLOT_RESP])] * 2 + [([24, 32], [SLOT_RESP])] * 3 \
        + [([24, 48], [SLOT_RESP])] * 2 + [([24], [SLOT_RESP]), ([24, 48], [SLOT_RESP])] \
        + [([24], [wire.CTRL_HDR_SIZE, 64, pad])] * 2
    assert [n for _table, n, _wlen in tables] == [3, 3, 3, 4]  # 2nd, 4th, 9th and last
    assert tables[-1][2] == wire.MIN_RESPONSE_SIZE
