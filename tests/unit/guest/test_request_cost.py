"""What reading one request's response costs the guest (guest/frontend/driver.py
Request.response), counted in Python function calls, which do not depend on the machine or
its load: every synchronous call and every asynchronous completion pays it once."""

from anymachine import python_calls

from pvgpu.guest.frontend.driver import command
from pvgpu.spec import wire

from test_kick_policy import session  # noqa: F401  (the fixture)

RESPONSE_CALLS = 5  # a response in its first descriptor (9 before issue 12's second pass)


def test_a_response_in_its_first_descriptor_costs_few_calls(session):  # noqa: F811
    drv = session.devices[0]
    req = drv.submit(command(wire.CMD_NOP))
    drv.wait(req)
    assert req.response() == (wire.RESP_OK_NODATA, b"")
    assert python_calls(req.response) <= RESPONSE_CALLS


def test_a_response_spilling_past_its_first_descriptor_is_read_whole(session):  # noqa: F811
    drv = session.devices[0]
    req = drv.submit(command(wire.CMD_NOP), writable=[(1 << 20, 16)])
    drv.wait(req)
    assert [n for _g, n in req.writable][:2] == [wire.CTRL_HDR_SIZE, 16]
    drv.mem.write(1 << 20, bytes(range(16)))  # the body, in the second descriptor
    req.used_len = wire.CTRL_HDR_SIZE + 16
    assert req.response() == (wire.RESP_OK_NODATA, bytes(range(16)))
