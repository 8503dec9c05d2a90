"""Memory (ISA-MEM-*): global loads and stores (consecutive, strided, scattered, every
width, scattered physical pages, system and peer pages), stores in lane order, a loaded
value that memory changes under, shared (static + dynamic, per block), local (per thread),
param, const and .global segments, generic addresses mixing spaces; page faults naming the
address and access for unmapped, read-only, misaligned and out-of-bounds accesses, with
nothing of the faulting instruction written."""

import numpy as np
import pytest
from smtest import RO, RW, VMID, Env

from pvgpu.host.hw.mmu import MmuFault
from pvgpu.host.hw.regs import PAGE_SIZE, PTE_PEER, PTE_SYSTEM
from pvgpu.spec import isa
from pvgpu.spec.kernels import ACCESS_READ, ACCESS_WRITE

IDX = """
  mov.u32 r0, %ctaid.x
  mov.u32 r1, %ntid.x
  mov.u32 r2, %tid.x
  mad.lo.u32 r0, r0, r1, r2
  ld.param.u64 rd1, [src]
  ld.param.u64 rd2, [dst]
  ld.param.u32 r3, [n]
  setp.ge.u32 p0, r0, r3
  @p0 exit
"""


@pytest.fixture
def env():
    return Env(256 << 20)


def kernel(env, body, params=".param u64 src\n.param u64 dst\n.param u32 n", shared=0, local=0):
    return env.load(f".entry k shared={shared} local={local}\n{params}\n{IDX}\n{body}\n  exit")


@pytest.mark.parametrize("t,dt", [("u8", np.uint8), ("s16", np.int16), ("u32", np.uint32),
                                  ("f64", np.float64), ("b64", np.uint64), ("f16", np.float16)])
@pytest.mark.parametrize("stride", [1, 3, -1])
def test_copy_every_width_and_stride(env, t, dt, stride):
    """dst[i] = src[(stride * i) mod n]: stride 1 is one range, others gather."""
    w = np.dtype(dt).itemsize
    n = 1000
    body = f"""
  mul.lo.u32 r4, r0, {stride & 0xFFFFFFFF}
  rem.u32 r4, r4, r3
  mul.wide.u32 rd3, r4, {w}
  add.u64 rd4, rd1, rd3
  ld.global.{t} r10, [rd4]
  mul.wide.u32 rd5, r0, {w}
  add.u64 rd6, rd2, rd5
  st.global.{t} [rd6], r10
""".replace("r10", "rd10" if w == 8 else "r10")
    if stride == -1:
        body = body.replace(f"mul.lo.u32 r4, r0, {stride & 0xFFFFFFFF}\n  rem.u32 r4, r4, r3",
                            "sub.u32 r4, r3, r0\n  sub.u32 r4, r4, 1")
    mod = kernel(env, body)
    src = (np.arange(n) * 7 + 3).astype(dt)
    a, b = env.buffer(src), env.buffer(np.zeros(n, dt))
    env.run(mod, grid=8, block=128, args=(a, b, n))
    idx = (np.arange(n) * stride) % n if stride > 0 else n - 1 - np.arange(n)
    np.testing.assert_array_equal(env.read(b, n, dt), src[idx])


def _scattered(env, va, npages, flags=RW):
    """Map npages at va onto physical pages in a shuffled order."""
    base = env.phys_next
    env.phys_next += npages * PAGE_SIZE
    order = np.random.default_rng(5).permutation(npages)
    env.pt.map_pages(va, [base + int(i) * PAGE_SIZE for i in order], flags)
    return va


def test_scattered_physical_pages(env):
    n = 8 * PAGE_SIZE // 4
    src_va = _scattered(env, 0x50_0000_0000, 8)
    dst_va = _scattered(env, 0x60_0000_0000, 8)
    data = np.arange(n, dtype=np.uint32) * 3
    env.write(src_va, data)
    body = """
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd1, rd3
  ld.global.u32 r10, [rd4]
  xor.b32 r11, r0, 5
  mul.wide.u32 rd5, r11, 4
  add.u64 rd6, rd2, rd5
  st.global.u32 [rd6], r10
"""
    env.run(kernel(env, body), grid=n // 256, block=256, args=(src_va, dst_va, n))
    np.testing.assert_array_equal(env.read(dst_va, n, np.uint32), data[np.arange(n) ^ 5])


def test_system_and_peer_pages():
    env = Env(64 << 20, peer_size=16 << 20)
    host = np.zeros(4 * PAGE_SIZE, np.uint8)
    bus = env.sysmem.dma_map(host)
    env.pt.map(0x70_0000_0000, bus, 4, RW | PTE_SYSTEM)
    env.pt.map(0x70_0000_4000, env.peer_bar + 8 * PAGE_SIZE, 4, RW | PTE_PEER)
    n = 8 * PAGE_SIZE // 4
    host.view(np.uint32)[:] = np.arange(n // 2, dtype=np.uint32)
    env.peer.write(8 * PAGE_SIZE, np.arange(n // 2, n, dtype=np.uint32))
    body = """
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd1, rd3
  ld.global.u32 r10, [rd4]
  add.u32 r10, r10, 1
  st.global.u32 [rd4], r10
  xor.b32 r11, r0, 1
  mul.wide.u32 rd5, r11, 4
  add.u64 rd6, rd2, rd5
  st.global.u32 [rd6], r10
"""
    dst = env.buffer(np.zeros(n, np.uint32))
    env.run(kernel(env, body), grid=n // 64, block=64, args=(0x70_0000_0000, dst, n))
    want = np.arange(n, dtype=np.uint32) + 1
    np.testing.assert_array_equal(host.view(np.uint32), want[:n // 2])
    np.testing.assert_array_equal(env.peer.view(8 * PAGE_SIZE, 2 * n).view(np.uint32), want[n // 2:])
    np.testing.assert_array_equal(env.read(dst, n, np.uint32), want[np.arange(n) ^ 1])


def test_stores_to_one_address_land_in_lane_order(env):
    body = """
  st.global.u32 [rd2], r0
  mul.wide.u32 rd3, r0, 0
  add.u64 rd4, rd2, rd3
  st.global.u32 [rd4+4], r0
"""
    dst = env.buffer(np.zeros(2, np.uint32))
    env.run(kernel(env, body), grid=3, block=96, args=(0, dst, 288))
    assert list(env.read(dst, 2, np.uint32)) == [287, 287]


def test_a_loaded_value_does_not_change_when_memory_does(env):
    """ld from a, st to a (and through a second mapping of the same pages), then use."""
    n = 4096
    a = env.buffer(np.arange(n, dtype=np.uint32))
    alias = 0x7A_0000_0000
    env.pt.map(alias, env._phys(a), 4, RW)
    body = """
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd1, rd3
  ld.global.u32 r10, [rd4]
  ld.global.u32 r12, [rd4]
  st.global.u32 [rd4], 7
  add.u64 rd5, rd2, rd3
  ld.global.u32 r11, [rd5]
  st.global.u32 [rd5], 9
  add.u32 r10, r10, r11
  add.u32 r10, r10, r12
  st.global.u32 [rd4], r10
"""
    env.run(kernel(env, body), grid=16, block=256, args=(a, alias, n))
    # r10 (old a) + r11 (7, through the alias) + r12 (old a)
    np.testing.assert_array_equal(env.read(a, n, np.uint32), 2 * np.arange(n) + 7)


def test_shared_memory_is_per_block_and_holds_static_then_dynamic(env):
    body = """
  shl.b32 r4, r2, 2
  mul.lo.u32 r5, r0, 10
  st.shared.u32 [r4], r5
  st.shared.u32 [r4+512], r0
  bar.sync 0
  sub.u32 r6, r1, 1
  sub.u32 r6, r6, r2
  shl.b32 r7, r6, 2
  ld.shared.u32 r8, [r7]
  ld.shared.u32 r9, [r7+512]
  add.u32 r8, r8, r9
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd2, rd3
  st.global.u32 [rd4], r8
"""
    n = 6 * 128
    dst = env.buffer(np.zeros(n, np.uint32))
    env.run(kernel(env, body, shared=512), grid=6, block=128, dyn_shared=512, args=(0, dst, n))
    i = np.arange(n)
    mirror = (i // 128) * 128 + 127 - i % 128
    np.testing.assert_array_equal(env.read(dst, n, np.uint32), mirror * 11)


def test_local_memory_is_per_thread_and_reached_generically(env):
    body = """
  mov.u64 rd5, 0
  cvta.local.u64 rd6, rd5
  st.local.u32 [0], r0
  st.local.u32 [12], r2
  shl.b32 r4, r2, 2
  and.b32 r4, r4, 12
  cvt.u64.u32 rd7, r4
  st.local.u32 [rd7+16], 5
  ld.local.u32 r8, [rd7+16]
  add.u64 rd8, rd6, 12
  ld.u32 r9, [rd8]
  ld.local.u32 r10, [0]
  add.u32 r8, r8, r9
  add.u32 r8, r8, r10
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd2, rd3
  st.global.u32 [rd4], r8
"""
    n = 3 * 64
    dst = env.buffer(np.zeros(n, np.uint32))
    env.run(kernel(env, body, local=32), grid=3, block=64, args=(0, dst, n))
    i = np.arange(n)
    np.testing.assert_array_equal(env.read(dst, n, np.uint32), 5 + i % 64 + i)


def test_generic_addresses_mixing_shared_local_and_global(env):
    body = """
  mov.u64 rd10, 0
  cvta.shared.u64 rd11, rd10
  cvta.local.u64 rd12, rd10
  st.shared.u32 [0], 111
  st.local.u32 [0], 222
  mul.wide.u32 rd3, r0, 4
  add.u64 rd13, rd1, rd3
  rem.u32 r4, r0, 3
  setp.eq.u32 p1, r4, 0
  setp.eq.u32 p2, r4, 1
  selp.u64 rd14, rd11, rd12, p1
  selp.u64 rd14, rd14, rd13, p1
  @p2 mov.u64 rd14, rd12
  ld.u32 r5, [rd14]
  add.u64 rd4, rd2, rd3
  st.u32 [rd4], r5
"""
    n = 96
    src = env.buffer(np.arange(n, dtype=np.uint32) + 1000)
    dst = env.buffer(np.zeros(n, np.uint32))
    env.run(kernel(env, body, shared=8, local=8), grid=2, block=48, args=(src, dst, n))
    i = np.arange(n)
    want = np.where(i % 3 == 0, 111, np.where(i % 3 == 1, 222, 1000 + i))
    np.testing.assert_array_equal(env.read(dst, n, np.uint32), want)


def test_const_and_global_segments(env):
    src = """
.entry k
.param u64 dst
.const table 16 0100000002000000030000000400000
.global counter 8 0500000000000000
  ld.param.u64 rd2, [dst]
  mov.u32 r0, %tid.x
  and.b32 r1, r0, 3
  mul.wide.u32 rd3, r1, 4
  mov.u64 rd4, table
  add.u64 rd5, rd4, rd3
  ld.const.u32 r2, [rd5]
  ld.global.u32 r3, [counter]
  add.u32 r2, r2, r3
  mul.wide.u32 rd6, r0, 4
  add.u64 rd7, rd2, rd6
  st.global.u32 [rd7], r2
  exit
"""
    src = src.replace("0100000002000000030000000400000", "01000000020000000300000004000000")
    mod = env.load(src)
    dst = env.buffer(np.zeros(8, np.uint32))
    env.run(mod, block=8, args=(dst,))
    assert list(env.read(dst, 8, np.uint32)) == [6, 7, 8, 9, 6, 7, 8, 9]


# ------------------------------------------------------------------ faults
def fault_kernel(env, body):
    return kernel(env, body)


def test_an_unmapped_load_faults_at_the_lowest_lane_address(env):
    a = env.buffer(np.zeros(1024, np.uint32))  # one page, then a hole
    body = """
  mul.wide.u32 rd3, r0, 12
  add.u64 rd4, rd1, rd3
  ld.global.u32 r10, [rd4]
  st.global.u32 [rd2], r10
"""
    dst = env.buffer(np.zeros(4, np.uint32))
    with pytest.raises(MmuFault) as e:
        env.run(kernel(env, body), block=1024, args=(a, dst, 1024))
    first_bad = a + -(-PAGE_SIZE // 12) * 12  # the first lane past the page
    assert (e.value.vmid, e.value.address, e.value.access) == (VMID, first_bad, ACCESS_READ)


def test_a_store_to_a_read_only_page_faults_and_writes_nothing_of_it(env):
    ro = env.buffer(np.zeros(2048, np.uint32), flags=RO)
    ok = env.buffer(np.zeros(2048, np.uint32))
    body = """
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd2, rd3
  st.global.u32 [rd4], 1
  add.u64 rd5, rd1, rd3
  st.global.u32 [rd5], 2
"""
    with pytest.raises(MmuFault) as e:
        env.run(kernel(env, body), grid=8, block=256, args=(ro, ok, 2048))
    assert (e.value.address, e.value.access) == (ro, ACCESS_WRITE)
    assert (env.read(ok, 2048, np.uint32)[:256] == 1).all()  # the first batch's earlier store
    assert (env.read(ro, 2048, np.uint32) == 0).all()


@pytest.mark.parametrize("space,size,why", [("shared", 64, "shared"), ("local", 16, "local")])
def test_out_of_bounds_shared_and_local_fault_at_the_generic_address(env, space, size, why):
    body = f"""
  shl.b32 r4, r2, 2
  st.{space}.u32 [r4], r2
"""
    opts = {"shared": size} if space == "shared" else {"local": size}
    mod = kernel(env, body, **opts)
    with pytest.raises(MmuFault) as e:
        env.run(mod, block=32, args=(0, 0, 32))
    base = isa.GENERIC_SHARED_BASE if space == "shared" else isa.GENERIC_LOCAL_BASE
    bad = size if space == "shared" else 0  # local: every lane's [4*tid] from 16 up is bad
    assert e.value.access == ACCESS_WRITE
    assert e.value.address == base + (bad if space == "shared" else 16)
    del why


def test_a_misaligned_access_faults(env):
    a = env.buffer(np.zeros(64, np.uint32))
    body = """
  mul.wide.u32 rd3, r0, 4
  add.u64 rd4, rd1, rd3
  ld.global.u32 r10, [rd4+2]
"""
    with pytest.raises(MmuFault) as e:
        env.run(kernel(env, body), block=8, args=(a, 0, 8))
    assert e.value.address == a + 2 and e.value.access == ACCESS_READ


def test_a_param_read_past_the_buffer_faults(env):
    body = "  ld.param.u32 r5, [20]"  # the parameters are 20 bytes
    with pytest.raises(MmuFault):
        env.run(kernel(env, body), block=1, args=(0, 0, 1))
