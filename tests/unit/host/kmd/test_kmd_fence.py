"""pvgpu.host.kmd.fence: in-order signalling from the write-back slot, callbacks exactly once."""

import threading

from pvgpu.host.hw import packets
from pvgpu.host.hw.vram import Vram
from pvgpu.host.kmd.bo import GpuFault
from pvgpu.host.kmd.fence import Fence, FenceDriver, signal_all

WB = 0x100


class FakeRing:
    def __init__(self):
        self.data = b""
        self.staged = []  # the packets write() staged, by index (rewrite)

    def write(self, data):
        self.data += data
        self.staged.append(data)
        return len(self.staged) - 1

    def rewrite(self, index, data):
        assert len(data) == len(self.staged[index])
        self.staged[index] = data


def make():
    vram = Vram(16 << 10)
    return FenceDriver(1, vram, WB), vram, FakeRing()


def test_emit_writes_a_fence_packet():
    fd, _, ring = make()
    f = fd.emit(ring)
    assert ring.data == packets.fence(WB, 1, packets.FENCE_IRQ)
    assert (f.engine, f.seq, f.signaled, f.wb_addr) == (1, 1, False, WB)
    assert fd.emit(ring).seq == 2


def test_irq_on_last_sets_only_the_last_quiet_fences_interrupt_flag():
    """A batch's quiet FENCEs: the last one's staged packet gets FENCE_IRQ, stamp slot and
    all else as emitted (irq_on_last patches its flags dword; nothing else changes)."""
    vram = Vram(16 << 10)
    fd, ring = FenceDriver(1, vram, WB, stamps=0x1000), FakeRing()
    fd.emit(ring, flags=0)
    fd.emit(ring, flags=0)
    fd.irq_on_last(ring)
    stamp = lambda seq: 0x1000 + 16 * seq  # noqa: E731 - (seq % STAMP_SLOTS) slots of 16 bytes
    assert ring.staged == [packets.fence(WB, 1, 0, stamp(1)),
                           packets.fence(WB, 2, packets.FENCE_IRQ, stamp(2))]


def test_process_signals_prefix_in_order():
    fd, vram, ring = make()
    fences = [fd.emit(ring) for _ in range(5)]
    order = []
    for f in fences:
        f.add_done_callback(lambda f: order.append(f.seq))
    assert fd.process() == 0
    vram.write_u64(WB, 3)  # the hardware wrote seq 3: 1..3 are done
    assert fd.process() == 3
    assert [f.signaled for f in fences] == [True, True, True, False, False]
    assert order == [1, 2, 3]
    vram.write_u64(WB, 5)
    fd.process()
    assert order == [1, 2, 3, 4, 5]
    assert fd.process() == 0 and not fd.pending


def test_irq_seq_hint_but_not_beyond_emitted():
    fd, _, ring = make()
    a, b = fd.emit(ring), fd.emit(ring)
    fd.process(seq=1)  # the interrupt's data, even if the slot read lags
    assert a.signaled and not b.signaled
    fd.process(seq=99)  # a value never emitted is not trusted
    assert not b.signaled
    fd.process(seq=2)
    assert b.signaled


def test_callback_exactly_once_and_immediate_when_done():
    fd, vram, ring = make()
    f = fd.emit(ring)
    calls = []
    f.add_done_callback(calls.append)
    vram.write_u64(WB, 1)
    fd.process()
    fd.process()
    assert f.signal() is False  # already signalled
    assert calls == [f]
    f.add_done_callback(calls.append)  # runs at once, on this thread
    assert calls == [f, f]


def test_broken_callback_does_not_stop_others():
    fd, vram, ring = make()
    f = fd.emit(ring)
    calls = []
    f.add_done_callback(lambda f: 1 / 0)
    f.add_done_callback(calls.append)
    vram.write_u64(WB, 1)
    fd.process()
    assert calls == [f]


def test_wait_and_cross_thread_signal():
    fd, vram, ring = make()
    f = fd.emit(ring)
    assert f.wait(0.01) is False
    threads = []

    def irq():
        vram.write_u64(WB, 1)
        fd.process()
    cb_thread = []
    f.add_done_callback(lambda f: cb_thread.append(threading.current_thread()))
    t = threading.Thread(target=irq)
    threads.append(t)
    t.start()
    assert f.wait(5) is True
    t.join()
    assert cb_thread == [t]  # called on the signalling thread


def test_error_set_before_signal():
    fd, vram, ring = make()
    f = fd.emit(ring)
    fault = GpuFault(3, 0xdead000, 1, 1)
    assert f.set_error(fault)
    assert not f.set_error("second")  # the first error wins
    vram.write_u64(WB, 1)
    fd.process()
    assert f.error is fault and "0xdead000" in str(f.error)
    assert not f.set_error("late")


def test_cancel_and_fail_all():
    fd, _, ring = make()
    a = fd.emit(ring)
    b = fd.emit(ring)
    fd.cancel(b)
    assert fd.emitted_seq == 1 and fd.emit(ring).seq == 2
    assert fd.fail_all("device stopped") == 2
    assert a.signaled and a.error == "device stopped"


def test_signal_all_marks_before_callbacks():
    fences = [Fence(0, i) for i in range(1, 4)]
    seen = []
    fences[0].add_done_callback(lambda f: seen.append([g.signaled for g in fences]))
    signal_all(fences)
    assert seen == [[True, True, True]]
    assert Fence.signaled_fence().signaled


def test_force_completion_writes_the_last_sequence_and_pops_everything():
    fd, _, ring = make()
    fences = [fd.emit(ring) for _ in range(3)]
    done = fd.force_completion()
    assert done == fences and not fd.pending
    assert fd.read_wb() == fences[-1].seq and not any(f.signaled for f in fences)
