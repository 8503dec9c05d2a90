"""The interrupt handler (top half) of one device.

Interrupts arrive on the engine threads, or on a submitting thread that runs a short job
itself (job.py): that one holds the device lock (the top half then works in its hold), no
other thread's handler holds one. Whatever runs outside the KMD (the error listener,
fence callbacks) runs once the device lock is released (lock.py). IRQ_FENCE retires the
jobs whose fences the write-back slot covers (their IB space goes back to the pool) and
then signals the fences. IRQ_PAGE_FAULT becomes a GpuFault attached to the oldest unsignalled job of that
VMID on that engine (the engine is in order, so that is the job that was executing);
IRQ_ILLEGAL_PACKET attaches a string. The job's fence then signals with `error` set,
because the command processor skips the rest of a faulting IB and carries on with the
FENCE behind it.
"""

from __future__ import annotations

import logging

from pvgpu.host.hw import regs
from pvgpu.host.kmd import lock as devlock
from pvgpu.host.kmd.bo import CodeFault, GpuFault
from pvgpu.host.kmd.fence import FenceDriver

log = logging.getLogger("pvgpu.kmd")


class IrqMixin:
    """KmdDevice's interrupt handler."""

    def _irq(self, irq) -> None:
        """Top half, on the engine thread that raised the interrupt."""
        source, engine = irq.source, irq.engine
        if not 0 <= engine < len(self.fences):
            log.warning("gpu%d: interrupt from unknown engine: %s", self.index, irq)
            return
        fd = self.fences[engine]
        if source == regs.IRQ_FENCE:
            self.stats["irq_fence"] += 1
            self._retire_fence_irq(fd, irq.data, irq.timestamp or None)
        elif source == regs.IRQ_PAGE_FAULT:
            self.stats["irq_page_fault"] += 1
            self._job_error(fd, irq.vmid, GpuFault(irq.vmid, irq.address, irq.access, irq.engine))
        elif source == regs.IRQ_ILLEGAL_PACKET:
            self.stats["irq_illegal_packet"] += 1
            self._job_error(fd, irq.vmid,
                            f"illegal packet {irq.data:#010x} at offset {irq.address:#x} "
                            f"(vmid {irq.vmid}, engine {regs.ENGINE_NAMES.get(irq.engine)})")
        elif source == regs.IRQ_CODE_FAULT:  # the SMs refused a code object, or a trap
            self.stats["irq_code_fault"] += 1
            self._job_error(fd, irq.vmid, CodeFault(irq.vmid, irq.address, irq.data, irq.engine))
        else:
            log.warning("gpu%d: unknown interrupt %s", self.index, irq)

    def _job_error(self, fd: FenceDriver, vmid: int, error) -> None:
        self._retire(fd, fd.retire())  # jobs already done cannot be the culprit
        with self.lock:
            target = None
            for f in fd.pending:
                job = self._jobs.get(f)
                if vmid == regs.VMID_KERNEL or job is None or job.context.vmid == vmid:
                    target = f
                    break
            if target is None:
                self.unclaimed_errors.append(error)
                if self.trace is not None:
                    self.trace.fault(self, fd.engine, error)
                log.warning("gpu%d: %s matches no pending job", self.index, error)
                return
            job = self._jobs.get(target)
            if job is not None:
                job.context.stats["faults"] += 1
                job.context.faults.append(error)
            if self.trace is not None:
                self.trace.fault(self, fd.engine, error, job.context if job is not None else None)
        if job is not None:  # (after the kicking _submit's hold, for an inline job)
            devlock.call_soon(job.context.report_error, error, job.timeline, job.kind)
        if not target.set_error(error):
            log.info("gpu%d: second error for %r: %s", self.index, target, error)
