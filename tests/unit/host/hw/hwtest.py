"""Test helpers for host/hw: hand-built page tables and ring writers (driver side, minimal).

These deliberately do by hand what the KMD does for real, so the hardware is tested
against the register/page-table format in host/hw/regs.py and nothing else.
"""

from __future__ import annotations

import threading

import numpy as np

from pvgpu.host.hw import packets
from pvgpu.host.hw.regs import (PAGE_SIZE, PDE_VALID, PT_ENTRIES, PTE_READ, PTE_VALID, PTE_WRITE,
                          RB_BASE, RB_DOORBELL, RB_RPTR, RB_SIZE, REG_ENGINE, REG_IRQ_ENABLE,
                          REG_VM_PT_BASE)

RW = PTE_VALID | PTE_READ | PTE_WRITE
RO = PTE_VALID | PTE_READ


class PageTables:
    """4-level page tables for one VMID, written into VRAM page by page."""

    def __init__(self, vram, first_table: int):
        self.vram = vram
        self.next = first_table
        self.root = self._alloc()

    def _alloc(self) -> int:
        addr = self.next
        self.next += PAGE_SIZE
        self.vram.fill(addr, PAGE_SIZE, 0)
        return addr

    def leaf(self, va: int) -> int:
        """VRAM address of the leaf table covering va (created on demand)."""
        table = self.root
        for shift in (39, 30, 21):
            slot = table + 8 * ((va >> shift) & (PT_ENTRIES - 1))
            pde = self.vram.read_u64(slot)
            if not pde & PDE_VALID:
                pde = self._alloc() | PDE_VALID
                self.vram.write_u64(slot, pde)
            table = pde & ~(PAGE_SIZE - 1)
        return table

    def pte_addr(self, va: int) -> int:
        return self.leaf(va) + 8 * ((va >> 12) & (PT_ENTRIES - 1))

    def map(self, va: int, addr: int, npages: int = 1, flags: int = RW) -> None:
        """Map npages consecutive pages at va to consecutive pages at addr."""
        assert va % PAGE_SIZE == 0 and addr % PAGE_SIZE == 0
        done = 0
        while done < npages:
            v = va + done * PAGE_SIZE
            idx = (v >> 12) & (PT_ENTRIES - 1)
            n = min(npages - done, PT_ENTRIES - idx)
            ptes = (addr + (done + np.arange(n, dtype=np.uint64)) * PAGE_SIZE) | flags
            start = self.leaf(v) + 8 * idx
            self.vram.qwords[start >> 3:(start >> 3) + n] = ptes
            done += n

    def map_pages(self, va: int, addrs, flags: int = RW) -> None:
        for i, a in enumerate(addrs):
            self.map(va + i * PAGE_SIZE, a, 1, flags)

    def set_pte(self, va: int, value: int) -> None:
        self.vram.write_u64(self.pte_addr(va), value)


def irq_collector(gpu):
    """Enable interrupts on gpu; -> (list of interrupts, Condition notified per interrupt)."""
    got, cond = [], threading.Condition()

    def handler(irq):
        with cond:
            got.append(irq)
            cond.notify_all()

    gpu.irq.set_handler(handler)
    gpu.mmio.write(REG_IRQ_ENABLE, 1)
    return got, cond


def wait_for(cond, predicate, timeout=5.0):
    with cond:
        assert cond.wait_for(predicate, timeout), "timed out"


class Ring:
    """Driver side of one engine's ring (no padding, no wrap handling beyond the CP's)."""

    def __init__(self, gpu, engine: int, base: int, size: int = PAGE_SIZE):
        self.gpu, self.engine, self.base, self.size = gpu, engine, base, size
        self.wptr = 0
        gpu.mmio.write(REG_ENGINE(engine, RB_BASE), base)
        gpu.mmio.write(REG_ENGINE(engine, RB_SIZE), size)

    def write(self, data: bytes) -> None:
        """Copy packets into the ring at wptr, wrapping at the end."""
        rptr = self.gpu.mmio.read(REG_ENGINE(self.engine, RB_RPTR))
        assert len(data) < self.size - (self.wptr - rptr) % self.size, "ring full (test bug)"
        off = 0
        while off < len(data):
            n = min(len(data) - off, self.size - self.wptr)
            self.gpu.vram.write(self.base + self.wptr, data[off:off + n])
            off += n
            self.wptr = (self.wptr + n) % self.size

    def submit(self, data: bytes) -> None:
        self.write(data)
        self.gpu.mmio.write(REG_ENGINE(self.engine, RB_DOORBELL), self.wptr)


def vm_setup(gpu, vmid: int, first_table: int) -> PageTables:
    pt = PageTables(gpu.vram, first_table)
    gpu.mmio.write(REG_VM_PT_BASE(vmid), pt.root)
    return pt


__all__ = ["PageTables", "Ring", "irq_collector", "wait_for", "vm_setup", "RW", "RO", "packets"]


def poll(predicate, timeout=5.0):
    """Bounded poll for hardware state that has no notification (e.g. 'a kernel started')."""
    import time
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.0005)
