"""The host side of the control channel binds one ZeroMQ ROUTER socket per endpoint
(spec CTL-ENDPOINT-1)."""

import zmq

from pvgpu.transport.channel import HostChannel


def test_ctl_endpoint_1_one_router_socket_per_endpoint(tmp_path):
    endpoints = [f"ipc://{tmp_path}/a.sock", f"ipc://{tmp_path}/b.sock", "tcp://127.0.0.1:0"]
    chan = HostChannel(endpoints)
    try:
        assert len(chan.endpoints) == len(chan._sockets) == 3
        assert all(s.type == zmq.ROUTER for s in chan._sockets)
        bound = {s.getsockopt_string(zmq.LAST_ENDPOINT) for s in chan._sockets}
        assert bound == set(chan.endpoints)
    finally:
        chan.close()
