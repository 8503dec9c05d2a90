"""pvgpu.host.kmd.ring: alloc/commit/undo, padding, wraparound and a full ring (fake registers)."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.hw import packets, regs
from pvgpu.host.hw.vram import Vram
from pvgpu.host.kmd.errors import InvalidArgument, RingFull
from pvgpu.host.kmd.ring import Ring

E = regs.ENGINE_COPY
BASE = 0x4000


class FakeMmio:
    """A register file whose RB_RPTR the test moves by hand."""

    def __init__(self):
        self.regs = {}
        self.rptr = 0
        self.doorbells = []

    def read(self, offset):
        if offset == regs.REG_ENGINE(E, regs.RB_RPTR):
            return self.rptr
        return self.regs.get(offset, 0)

    def write(self, offset, value):
        self.regs[offset] = value
        if offset == regs.REG_ENGINE(E, regs.RB_DOORBELL):
            self.doorbells.append(value)


def make_ring(size=4096, **kw):
    mmio, vram = FakeMmio(), Vram(64 << 10)
    ring = Ring(mmio, vram, E, BASE, size, **kw)
    ring.init()
    return ring, mmio, vram


def consume(ring, mmio, vram):
    """Play command processor: decode packets from rptr to the published wptr."""
    out = []
    while mmio.rptr != ring.wptr:
        hdr = vram.read_u32(BASE + mmio.rptr)
        op, ndw = packets.split_header(hdr)
        raw = b"".join(vram.read(BASE + (mmio.rptr + 4 * i) % ring.size, 4) for i in range(1 + ndw))
        if op != packets.PKT_NOP:
            out.append(raw)
        mmio.rptr = (mmio.rptr + 4 * (1 + ndw)) % ring.size
    return out


def test_init_programs_registers():
    ring, mmio, _ = make_ring()
    assert mmio.regs[regs.REG_ENGINE(E, regs.RB_BASE)] == BASE
    assert mmio.regs[regs.REG_ENGINE(E, regs.RB_SIZE)] == 4096
    assert mmio.regs[regs.REG_ENGINE(E, regs.RB_RESET)] == 1
    assert ring.idle


def test_commit_pads_to_8_dwords_and_rings_doorbell():
    ring, mmio, vram = make_ring()
    ring.alloc(5)
    ring.write(packets.wait(0x1000, 7))
    wptr = ring.commit()
    assert wptr == 32 and mmio.doorbells == [32]
    assert packets.split_header(vram.read_u32(BASE + 20)) == (packets.PKT_NOP, 2)
    assert consume(ring, mmio, vram) == [packets.wait(0x1000, 7)]
    assert ring.idle


def test_undo_restores_wptr():
    ring, mmio, vram = make_ring()
    ring.alloc(6)
    ring.write(packets.fence(0x1000, 1))
    ring.undo()
    assert ring.wptr == 0 and mmio.doorbells == []
    ring.alloc(5)
    ring.write(packets.tlb_flush(3))
    ring.commit()
    assert consume(ring, mmio, vram) == [packets.tlb_flush(3)]


def test_transaction_misuse_is_an_assertion():
    ring, _, _ = make_ring()
    with pytest.raises(AssertionError):
        ring.commit()
    ring.alloc(2)
    with pytest.raises(AssertionError):
        ring.write(bytes(12))  # beyond the reservation (2 dwords padded to 8 is 32 bytes: ok)
        ring.write(bytes(24))
    with pytest.raises(AssertionError):
        ring.alloc(2)
    with pytest.raises(InvalidArgument):
        Ring(FakeMmio(), Vram(64 << 10), E, BASE, 3000)


def test_packet_never_straddles_the_end():
    ring, mmio, vram = make_ring()
    pkt = packets.copy(1, 2, 3)  # 7 dwords -> 8 with padding
    for _ in range(4096 // 32 - 2):
        ring.alloc(7)
        ring.write(pkt)
        ring.commit()
        consume(ring, mmio, vram)
    assert ring.wptr == 4096 - 64
    ring.alloc(12)  # 48 bytes do not fit in the 64 left... with padding to 64 they do
    ring.write(packets.nop(12))
    ring.commit()
    assert ring.wptr == 0
    ring.alloc(9)  # 9 dwords -> 16 with padding; starts at 0
    ring.write(packets.launch(1, (1, 1, 1), (1, 1, 1), []))
    ring.commit()
    assert ring.wptr == 64
    consume(ring, mmio, vram)
    ring.alloc(7)
    ring.write(pkt)
    ring.commit()
    # now force a skip: fill up to 32 bytes before the end, then ask for 16 dwords
    while ring.wptr != 4096 - 32:
        ring.alloc(7)
        ring.write(pkt)
        ring.commit()
        consume(ring, mmio, vram)
    raw = packets.launch(6, (1, 1, 1), (1, 1, 1), [1, 2, 3, 4])  # 17 dwords
    ring.alloc(17)
    ring.write(raw)
    ring.commit()
    assert ring.wptr == 4 * 24
    assert vram.read(BASE, len(raw)) == raw  # started at offset 0
    assert consume(ring, mmio, vram) == [raw]


def test_full_ring_waits_then_raises():
    slept = []
    ring, mmio, vram = make_ring(timeout=0.05, sleep=lambda s: slept.append(s))
    pkt = packets.copy(1, 2, 3)
    for _ in range(4096 // 32 - 1):
        ring.alloc(7)
        ring.write(pkt)
        ring.commit()
    assert ring.wptr == 4096 - 32
    with pytest.raises(RingFull) as e:
        ring.alloc(7)  # would make wptr == rptr: a full ring that looks idle
    assert e.value.code == "ring_full" and slept


def test_full_ring_proceeds_when_the_engine_catches_up():
    ring, mmio, vram = make_ring(timeout=5)
    ring.sleep = lambda s: consume(ring, mmio, vram)
    pkt = packets.copy(1, 2, 3)
    for _ in range(3 * 4096 // 32):
        ring.alloc(7)
        ring.write(pkt)
        ring.commit()
    assert ring.full_waits > 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans(), st.booleans()), max_size=120))
def test_random_streams_arrive_in_order(jobs):
    """Whatever the sizes, undos and consumer timing, the CP sees exactly the committed packets."""
    ring, mmio, vram = make_ring(timeout=5)
    ring.sleep = lambda s: consume(ring, mmio, vram)
    sent, seen = [], []
    for i, (ndw, undo, drain) in enumerate(jobs):
        ring.alloc(ndw + 1)
        pkt = struct.pack("<I", packets.header(packets.PKT_LAUNCH, ndw)) + \
            struct.pack(f"<{ndw}I", *([i] * ndw))
        ring.write(pkt)
        if undo:
            ring.undo()
        else:
            ring.commit()
            sent.append(pkt)
        if drain:
            seen += consume(ring, mmio, vram)
    seen += consume(ring, mmio, vram)
    assert seen == sent


def test_a_transaction_reaches_vram_in_one_write_at_commit():
    """Packets are staged until commit(), which copies them (and the padding) into the
    ring with one VRAM write; without a doorbell only RB_WPTR is written."""
    ring, mmio, vram = make_ring()
    writes = []
    real = vram.write
    vram.write = lambda addr, data: (writes.append((addr, len(data))), real(addr, data))
    ring.alloc(5 + 6)
    ring.write(packets.wait(0x1000, 7))
    ring.write(packets.fence(0x2000, 3, packets.FENCE_IRQ))
    assert writes == []
    wptr = ring.commit(doorbell=False)
    assert writes == [(BASE, wptr)] and wptr == 64
    assert mmio.doorbells == [] and mmio.regs[regs.REG_ENGINE(E, regs.RB_WPTR)] == 64
    assert consume(ring, mmio, vram) == [packets.wait(0x1000, 7),
                                         packets.fence(0x2000, 3, packets.FENCE_IRQ)]
    ring.alloc(5)
    ring.write(packets.wait(0x1000, 8))
    ring.undo()
    assert len(writes) == 1 and ring.wptr == 64
