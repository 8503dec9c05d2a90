"""host/hw/pcie.py: topology, p2pdma distance, BARs, peer views; P2P through a copy engine."""

import numpy as np
import pytest
from hwtest import RW, Ring, irq_collector, vm_setup, wait_for

from pvgpu.host.hw import packets as P
from pvgpu.host.hw.gpu import Gpu, Platform
from pvgpu.host.hw.pcie import (DEFAULT_LAYOUT, LAYOUTS, P2PDMA_MAP_BUS_ADDR, P2PDMA_MAP_NAMES,
                          P2PDMA_MAP_NOT_SUPPORTED, P2PDMA_MAP_THRU_HOST_BRIDGE,
                          PEER_BAR_BASE, PEER_BAR_LIMIT, Endpoint, HostBridge, PcieFabric,
                          PeerFault, RootPort, SwitchDownstreamPort, SwitchUpstreamPort,
                          p2pdma_distance)
from pvgpu.host.hw.regs import ENGINE_COPY0, IRQ_FENCE, IRQ_PAGE_FAULT, PAGE_SIZE, PTE_PEER
from pvgpu.host.hw.sysmem import SYSMEM_BUS_BASE, SystemMemory
from pvgpu.host.hw.vram import Vram

MiB = 1 << 20


def fabric(layout=DEFAULT_LAYOUT, sizes=(16 * MiB, 16 * MiB)):
    return PcieFabric(layout, [Vram(s) for s in sizes])


@pytest.mark.parametrize("layout, map_type, dist", [
    ("switch", P2PDMA_MAP_BUS_ADDR, 4),  # gpu -> dsp -> usp <- dsp <- gpu
    ("hostbridge", P2PDMA_MAP_THRU_HOST_BRIDGE, 4),  # no common bridge: 2 + 2 (Linux)
    ("sockets", P2PDMA_MAP_NOT_SUPPORTED, -1),
])
def test_layout_map_type_and_distance_both_directions(layout, map_type, dist):
    f = fabric(layout)
    g0, g1 = f.endpoints
    assert g0.p2pdma_distance(g1) == g1.p2pdma_distance(g0) == (map_type, dist)
    assert f.routes[0][1] == f.routes[1][0] == (map_type, dist)
    assert g0.p2pdma_distance(g0) == (P2PDMA_MAP_BUS_ADDR, 0)
    assert f.routes[1][1] == (P2PDMA_MAP_BUS_ADDR, 0)


def test_layouts_have_the_modelled_shapes():
    assert DEFAULT_LAYOUT == "switch" and set(LAYOUTS) >= {"switch", "hostbridge", "sockets"}
    sw = fabric("switch")
    g0, g1 = sw.endpoints
    assert isinstance(g0.parent, SwitchDownstreamPort) and g0.parent is not g1.parent
    assert isinstance(g0.parent.parent, SwitchUpstreamPort) and g0.parent.parent is g1.parent.parent
    assert isinstance(g0.parent.parent.parent, RootPort)
    assert len(sw.host_bridges) == 1 and sw.host_bridges[0].parent is None
    hb = fabric("hostbridge")
    assert all(isinstance(g.parent, RootPort) for g in hb.endpoints)
    assert hb.endpoints[0].parent is not hb.endpoints[1].parent
    assert len(hb.host_bridges) == 1 and hb.host_bridges[0].whitelisted
    so = fabric("sockets")
    assert len(so.host_bridges) == 2
    assert [g.host_bridge() for g in so.endpoints] == list(so.host_bridges)
    # bus/device/function strings: unique, one PCI domain per host bridge
    bdfs = [n.bdf for n in _nodes(so)]
    assert len(set(bdfs)) == len(bdfs) and {b[:4] for b in bdfs} == {"0000", "0001"}
    assert [g.bdf for g in sw.endpoints] == ["0000:03:00.0", "0000:04:00.0"]


def _nodes(f):
    todo, out = list(f.host_bridges), []
    while todo:
        n = todo.pop()
        out.append(n)
        todo.extend(n.children)
    return out


def test_unknown_layout_names_the_valid_ones():
    with pytest.raises(ValueError) as e:
        fabric("mesh")
    assert all(name in str(e.value) for name in LAYOUTS)
    with pytest.raises(ValueError):
        Platform(num_gpus=2, vram_size=MiB, topology="mesh")


def test_acs_redirect_forces_the_route_through_the_host_bridge():
    def switch(whitelisted, acs_on):
        hb = HostBridge("hb", whitelisted=whitelisted)
        usp = SwitchUpstreamPort("usp", RootPort("rp", hb), acs_redirect=acs_on == "usp")
        return [Endpoint(f"g{i}", SwitchDownstreamPort(f"dsp{i}", usp,
                                                       acs_redirect=acs_on == f"dsp{i}"), None, i)
                for i in range(2)]

    for acs_on in ("dsp0", "dsp1", "usp"):  # the provider's path, the client's, the common bridge
        a, b = switch(True, acs_on)
        assert p2pdma_distance(a, b) == p2pdma_distance(b, a) == (P2PDMA_MAP_THRU_HOST_BRIDGE, 4)
        a, b = switch(False, acs_on)
        assert p2pdma_distance(a, b) == p2pdma_distance(b, a) == (P2PDMA_MAP_NOT_SUPPORTED, -1)
    a, b = switch(False, None)  # the whitelist only matters through the host bridge
    assert p2pdma_distance(a, b) == (P2PDMA_MAP_BUS_ADDR, 4)


def test_two_functions_below_one_port_and_an_unlisted_host_bridge():
    hb = HostBridge("hb", whitelisted=False)
    rp = RootPort("rp0", hb)
    f0, f1 = Endpoint("f0", rp, None, 0), Endpoint("f1", rp, None, 1)
    assert p2pdma_distance(f0, f1) == (P2PDMA_MAP_BUS_ADDR, 2)
    other = Endpoint("g", RootPort("rp1", hb), None, 2)
    assert p2pdma_distance(f0, other) == (P2PDMA_MAP_NOT_SUPPORTED, -1)
    assert P2PDMA_MAP_NAMES[P2PDMA_MAP_THRU_HOST_BRIDGE] == "THRU_HOST_BRIDGE"


def test_bars_are_aligned_disjoint_and_below_system_memory():
    f = fabric("switch", (16 * MiB, 24 * MiB, 8 * MiB))
    bars = sorted((g.bar0, g.bar0 + g.bar0_size) for g in f.endpoints)
    for g in f.endpoints:
        assert g.bar0_size >= g.vram.size and g.bar0_size & (g.bar0_size - 1) == 0
        assert g.bar0 % g.bar0_size == 0
    assert f.endpoints[1].bar0_size == 32 * MiB
    assert all(e0 < s1 for (_, e0), (s1, _) in zip(bars, bars[1:]))  # a hole between BARs
    assert PEER_BAR_BASE <= bars[0][0] and bars[-1][1] <= PEER_BAR_LIMIT <= SYSMEM_BUS_BASE


def test_describe_shows_the_tree_and_every_pair():
    for layout in LAYOUTS:
        f = fabric(layout, (16 * MiB,) * 3)
        text = "\n".join(f.describe())
        for g in f.endpoints:
            assert g.name in text and g.bdf in text and f"{g.bar0:#x}" in text
        kind = P2PDMA_MAP_NAMES[f.routes[0][1][0]]
        assert f"gpu0 <-> gpu1: {kind}" in text and "gpu1 <-> gpu2" in text


def test_peer_view_is_a_view_of_the_owners_vram():
    f = fabric()
    g0, g1 = f.endpoints
    v = f.peer_view(0, g1.bar0 + 3 * PAGE_SIZE + 8, 100, write=True)
    assert v.shape == (100,) and np.shares_memory(v, g1.vram.mem)
    v[:] = 0x5A
    assert g1.vram.read(3 * PAGE_SIZE + 8, 100) == b"\x5a" * 100
    assert g0.vram.read(3 * PAGE_SIZE + 8, 100) == bytes(100)
    g1.vram.write(0, b"peer")
    assert f.peer_view(0, g1.bar0, 4).tobytes() == b"peer"
    assert f.peer_view(1, g1.bar0, 4).tobytes() == b"peer"  # a device reaches its own BAR
    s = f.stats()
    assert s["gpu0->gpu1"] == {"read_bytes": 4, "write_bytes": 100}
    assert s["gpu1->gpu1"] == {"read_bytes": 4, "write_bytes": 0}
    assert s["gpu1->gpu0"] == {"read_bytes": 0, "write_bytes": 0}


def test_peer_view_outside_the_vram_of_a_bar_faults_at_the_first_bad_byte():
    f = fabric("switch", (16 * MiB, 12 * MiB))  # gpu1: a 16 MiB BAR over 12 MiB of VRAM
    g0, g1 = f.endpoints
    end = g1.bar0 + g1.vram.size
    with pytest.raises(PeerFault) as e:
        f.peer_view(0, end - 16, 32)
    assert e.value.address == end
    for addr in (end, g1.bar0 + g1.bar0_size - 8, g0.bar0 - PAGE_SIZE,
                 g0.bar0 + g0.bar0_size, SYSMEM_BUS_BASE, 0):
        with pytest.raises(PeerFault) as e:
            f.peer_view(0, addr, 8)
        assert e.value.address == addr
    assert f.stats()["gpu0->gpu1"] == {"read_bytes": 0, "write_bytes": 0}


def test_peer_view_on_an_unsupported_route_faults():
    f = fabric("sockets")
    g0, g1 = f.endpoints
    with pytest.raises(PeerFault) as e:
        f.peer_view(0, g1.bar0 + 64, 8, write=True)
    assert e.value.address == g1.bar0 + 64 and "not supported" in e.value.reason
    assert f.peer_view(1, g1.bar0 + 64, 8).shape == (8,)  # its own BAR still works


def test_platform_wires_the_fabric_into_its_gpus():
    plat = Platform(num_gpus=2, vram_size=16 * MiB, topology="hostbridge")
    g0, g1 = plat.gpus
    assert plat.fabric.layout == "hostbridge"
    assert g0.pci is plat.fabric.endpoints[0] and g0.vram is g0.pci.vram
    assert g1.mmu.fabric is plat.fabric and g1.mmu.requester == 1
    assert g0.pci.p2pdma_distance(g1.pci) == (P2PDMA_MAP_THRU_HOST_BRIDGE, 4)
    alone = Gpu(5, 16 * MiB, SystemMemory())  # a private one-GPU fabric
    assert alone.pci.bar0 >= PEER_BAR_BASE and alone.pci.vram is alone.vram


def _p2p_copy(topology):
    """GPU0's copy engine: local VRAM -> a VA mapped PTE_PEER onto GPU1's BAR0."""
    plat = Platform(num_gpus=2, vram_size=16 * MiB, topology=topology)
    g0, g1 = plat.gpus
    src, va_src, va_dst, n = 8 * MiB, 1 << 32, (1 << 32) + (1 << 30), 3 * PAGE_SIZE + 100
    pt = vm_setup(g0, 1, 1 * MiB)
    pt.map(va_src, src, 4)
    pt.map(va_dst, g1.pci.bar0 + 4 * MiB, 4, RW | PTE_PEER)
    data = np.random.default_rng(3).integers(0, 256, n, dtype=np.uint8)
    g0.vram.write(src, data)
    with plat:
        got, cond = irq_collector(g0)
        g0.vram.write(3 * MiB, P.copy(va_src, va_dst, n))
        Ring(g0, ENGINE_COPY0, 2 * MiB).submit(P.indirect_buffer(3 * MiB, 7, 1)
                                               + P.fence(5 * MiB, 1))
        wait_for(cond, lambda: any(i.source == IRQ_FENCE for i in got))
    return plat, data, got


def test_copy_engine_writes_into_the_peers_vram():
    plat, data, got = _p2p_copy("switch")
    g0, g1 = plat.gpus
    assert not [i for i in got if i.source == IRQ_PAGE_FAULT]
    assert np.array_equal(g1.vram.view(4 * MiB, data.shape[0]), data)
    assert not g0.vram.view(4 * MiB, data.shape[0]).any()
    assert plat.fabric.stats()["gpu0->gpu1"]["write_bytes"] == data.shape[0]


def test_copy_to_an_unreachable_peer_raises_a_page_fault():
    plat, data, got = _p2p_copy("sockets")
    fault = [i for i in got if i.source == IRQ_PAGE_FAULT][0]
    assert (fault.vmid, fault.address) == (1, (1 << 32) + (1 << 30))
    assert not plat.gpus[1].vram.view(4 * MiB, data.shape[0]).any()
