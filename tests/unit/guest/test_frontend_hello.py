"""The frontend binds only to pvgpu devices (spec DEV-ID-3): a hello reply that offers a
device of another id is refused before any guest memory or queue is set up for it."""

import pytest

from pvgpu.guest.frontend import session as session_mod
from pvgpu.guest.frontend.session import ControlRequestError, FrontendSession
from pvgpu.spec import wire


def hello_reply(device_id):
    return {"ok": True, "session": "s-test", "heartbeat_ms": 1000,
            "devices": [{"index": 0, "name": "pvgpu0", "vram_size": 1 << 30,
                         "device_id": wire.VIRTIO_ID_PVGPU},
                        {"index": 1, "name": "other", "vram_size": 1 << 30,
                         "device_id": device_id}]}


@pytest.mark.parametrize("device_id", [16, 0, None, "0xb0"])
def test_a_device_of_another_id_is_refused(monkeypatch, tmp_path, device_id):
    sent = []

    def control(self, op, **fields):
        sent.append(op)
        assert op == wire.OP_HELLO, f"{op} sent after a bad hello reply"
        return hello_reply(device_id)

    monkeypatch.setattr(FrontendSession, "control", control)
    drivers = []
    monkeypatch.setattr(session_mod, "VirtioGpuDriver",
                        lambda *a, **k: drivers.append(a) or pytest.fail("driver made"))
    (tmp_path / "none.sock").touch()  # no host behind it: control() answers instead
    with pytest.raises(ControlRequestError) as e:
        FrontendSession(f"ipc://{tmp_path}/none.sock", memory=wire.MEMORY_INLINE,
                        mem_size=1 << 20, heartbeat_ms=1000)
    assert e.value.error == wire.CTL_ERR_MALFORMED and "DEV-ID-3" in e.value.message
    assert sent == [wire.OP_HELLO] and drivers == []
