"""The PCIe fabric the GPUs sit in: topology, BARs and peer-to-peer (P2P) routing.

Models what Linux's drivers/pci/p2pdma.c needs to decide whether one device may DMA into
another device's BAR. The topology is a tree of nodes, each with `name`, `parent`,
`children` and a bus/device/function string `bdf`:

  HostBridge           a root complex (one PCI domain); `whitelisted` like p2pdma's host
                       bridge whitelist: P2P may be routed through it
  RootPort             a root port of a host bridge
  SwitchUpstreamPort   the upstream port of a PCIe switch
  SwitchDownstreamPort a downstream port of that switch
  Endpoint             a GPU function; BAR0 exposes its whole VRAM

The ports are bridges and may have `acs_redirect` set (ACS P2P request/completion
redirect): like Linux, a redirecting bridge on the path forces P2P through the host bridge.

p2pdma_distance(provider, client) follows calc_map_type_and_dist(): both devices walk up
with pci_upstream_bridge() (which stops at a root port: host bridges are not bridges of
the tree) until they meet; the distance is the number of hops from each device to that
common upstream bridge (two functions of one device: 2; behind one switch: 4; a device to
itself: 0). A common upstream bridge and no ACS redirect on the path -> P2PDMA_MAP_BUS_ADDR
(the switch routes the TLPs). No common upstream bridge, or an ACS redirect -> through the
host bridge: P2PDMA_MAP_THRU_HOST_BRIDGE if both devices are below the same whitelisted
host bridge, else P2PDMA_MAP_NOT_SUPPORTED with distance -1 (as pci_p2pdma_distance()
returns). Devices below different host bridges never reach each other (every whitelist
entry here behaves like Linux's REQ_SAME_HOST_BRIDGE ones).

PcieFabric(layout, vrams) builds one of LAYOUTS around the GPUs' VRAM (GPU i is endpoint
i, named gpu<i>), numbers buses depth first (one PCI domain per host bridge) and assigns
BAR0s: each is naturally aligned, a power of two >= its VRAM, in the peer window
[PEER_BAR_BASE, PEER_BAR_LIMIT) below the system-memory bus addresses (sysmem.py), and a
hole follows every BAR, so bus addresses that look contiguous always lie inside one BAR
(the MMU merges contiguous pages into one extent). Bytes of a BAR beyond its VRAM fault.

peer_view(requester, bus_addr, size, write) is for the hardware (the MMU resolving a
PTE_PEER page): a numpy view into the owning GPU's VRAM, or PeerFault (internal to
host/hw, like SysmemFault) with the first address that is not reachable. A device may
reach its own BAR through a PEER page (BUS_ADDR, distance 0), as a real device can target
its own BAR. stats() counts the bytes of peer views handed out per (requester, owner)
pair, for reading and for writing. The topology is immutable once built, so lookups take
no lock; only the counters do.
"""

from __future__ import annotations

import bisect
import threading

from pvgpu.host.hw.regs import PAGE_SIZE
from pvgpu.host.hw.sysmem import SYSMEM_BUS_BASE

P2PDMA_MAP_UNKNOWN = 0
P2PDMA_MAP_NOT_SUPPORTED = 1
P2PDMA_MAP_BUS_ADDR = 2
P2PDMA_MAP_THRU_HOST_BRIDGE = 3
P2PDMA_MAP_NAMES = {P2PDMA_MAP_UNKNOWN: "UNKNOWN", P2PDMA_MAP_NOT_SUPPORTED: "NOT_SUPPORTED",
                    P2PDMA_MAP_BUS_ADDR: "BUS_ADDR",
                    P2PDMA_MAP_THRU_HOST_BRIDGE: "THRU_HOST_BRIDGE"}

PEER_BAR_BASE = 1 << 40
PEER_BAR_LIMIT = SYSMEM_BUS_BASE


class PeerFault(Exception):
    """A peer access the fabric refuses; `address` is its first unreachable bus address."""

    def __init__(self, address: int, reason: str):
        super().__init__(f"peer fault at bus address {address:#x}: {reason}")
        self.address = address
        self.reason = reason


class PciNode:
    kind = "device"
    acs_redirect = False

    def __init__(self, name: str, parent: PciNode | None = None):
        self.name = name
        self.parent = parent
        self.children: list | tuple = []
        self.bdf = ""
        if parent is not None:
            parent.children.append(self)

    def upstream_bridge(self) -> PciNode | None:
        """pci_upstream_bridge(): the bridge above, None above a root port."""
        p = self.parent
        return None if p is None or isinstance(p, HostBridge) else p

    def host_bridge(self) -> HostBridge:
        node = self
        while node.parent is not None:
            node = node.parent
        return node

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r}, {self.bdf!r})"


class HostBridge(PciNode):
    kind = "host bridge"

    def __init__(self, name: str, whitelisted: bool = True):
        super().__init__(name)
        self.whitelisted = whitelisted


class PciBridge(PciNode):
    def __init__(self, name: str, parent: PciNode, acs_redirect: bool = False):
        super().__init__(name, parent)
        self.acs_redirect = acs_redirect


class RootPort(PciBridge):
    kind = "root port"


class SwitchUpstreamPort(PciBridge):
    kind = "switch upstream port"


class SwitchDownstreamPort(PciBridge):
    kind = "switch downstream port"


class Endpoint(PciNode):
    """A GPU function. bar0/bar0_size are assigned by PcieFabric (0 until then)."""
    kind = "endpoint"

    def __init__(self, name: str, parent: PciNode, vram, index: int = 0):
        super().__init__(name, parent)
        self.vram = vram
        self.index = index
        self.bar0 = 0
        self.bar0_size = 0

    def p2pdma_distance(self, client: Endpoint) -> tuple:
        """pci_p2pdma_distance() with this device as the provider -> (map_type, distance)."""
        return p2pdma_distance(self, client)


def p2pdma_distance(provider: PciNode, client: PciNode) -> tuple:
    """-> (P2PDMA_MAP_*, distance) as Linux's calc_map_type_and_dist(); -1 if unsupported."""
    acs = 0
    a, dist_a, common = provider, 0, None
    while a is not None:
        acs += a.acs_redirect
        bb, dist_b = client, 0
        while bb is not None and bb is not a:
            bb = bb.upstream_bridge()
            dist_b += 1
        if bb is a:
            common = a
            break
        a = a.upstream_bridge()
        dist_a += 1
    dist = dist_a + dist_b
    if common is not None:
        bb = client
        while bb is not common:
            acs += bb.acs_redirect
            bb = bb.upstream_bridge()
        if not acs:
            return P2PDMA_MAP_BUS_ADDR, dist
    host = provider.host_bridge()
    if host is client.host_bridge() and host.whitelisted:
        return P2PDMA_MAP_THRU_HOST_BRIDGE, dist
    return P2PDMA_MAP_NOT_SUPPORTED, -1


# ------------------------------------------------------------------ layouts
def _switch(vrams) -> tuple:
    """One host bridge -> root port -> switch; every GPU on a downstream port."""
    hb = HostBridge("hb0")
    usp = SwitchUpstreamPort("usp0", RootPort("rp0", hb))
    return [hb], [Endpoint(f"gpu{i}", SwitchDownstreamPort(f"dsp{i}", usp), v, i)
                  for i, v in enumerate(vrams)]


def _hostbridge(vrams) -> tuple:
    """One whitelisted host bridge; every GPU on its own root port."""
    hb = HostBridge("hb0")
    return [hb], [Endpoint(f"gpu{i}", RootPort(f"rp{i}", hb), v, i)
                  for i, v in enumerate(vrams)]


def _sockets(vrams) -> tuple:
    """One root complex (socket) per GPU: no P2P between any two GPUs."""
    hbs = [HostBridge(f"hb{i}") for i in range(len(vrams))]
    return hbs, [Endpoint(f"gpu{i}", RootPort(f"rp{i}", hbs[i]), v, i)
                 for i, v in enumerate(vrams)]


LAYOUTS = {"switch": _switch, "hostbridge": _hostbridge, "sockets": _sockets}
DEFAULT_LAYOUT = "switch"


def _size(n: int) -> str:
    """lspci's size notation: 16M, 1G, 4K."""
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if n and not n % (1 << shift):
            return f"{n >> shift}{unit}"
    return str(n)


def _bar_size(vram_size: int) -> int:
    return max(PAGE_SIZE, 1 << (vram_size - 1).bit_length())


class PcieFabric:
    """The platform's PCIe topology around its GPUs (see the module docstring)."""

    def __init__(self, layout: str = DEFAULT_LAYOUT, vrams=()):
        if layout not in LAYOUTS:
            raise ValueError(f"unknown PCIe layout {layout!r}; valid: {', '.join(LAYOUTS)}")
        self.layout = layout
        host_bridges, endpoints = LAYOUTS[layout](list(vrams))
        self.host_bridges = tuple(host_bridges)
        self.endpoints = tuple(endpoints)
        for domain, hb in enumerate(self.host_bridges):
            self._enumerate(hb, domain)
        base = PEER_BAR_BASE
        for ep in self.endpoints:
            size = _bar_size(ep.vram.size)
            ep.bar0 = (base + size - 1) & ~(size - 1)
            ep.bar0_size = size
            base = ep.bar0 + size + PAGE_SIZE  # the hole after every BAR
        if base > PEER_BAR_LIMIT:
            raise ValueError("the GPUs' BARs do not fit the peer window")
        self._by_bar = sorted(self.endpoints, key=lambda ep: ep.bar0)
        self._bar_starts = [ep.bar0 for ep in self._by_bar]
        self.routes = tuple(tuple(p2pdma_distance(owner, req) for owner in self.endpoints)
                            for req in self.endpoints)  # [requester][owner]
        self._lock = threading.Lock()
        n = len(self.endpoints)
        self._read = [[0] * n for _ in range(n)]
        self._written = [[0] * n for _ in range(n)]

    @staticmethod
    def _enumerate(hb: HostBridge, domain: int) -> None:
        """Depth-first bus numbering: the host bridge at 00:00.0, root ports on bus 0."""
        next_bus = 1

        def visit(node, bus, slot):
            nonlocal next_bus
            node.bdf = f"{domain:04x}:{bus:02x}:{slot:02x}.0"
            node.children = tuple(node.children)
            if node.children:
                secondary = next_bus
                next_bus += 1
                for i, child in enumerate(node.children):
                    visit(child, secondary, i)

        hb.bdf = f"{domain:04x}:00:00.0"
        hb.children = tuple(hb.children)
        for i, rp in enumerate(hb.children):
            visit(rp, 0, i + 1)

    # -------------------------------------------------------------- hardware side
    def peer_view(self, requester: int, bus_addr: int, size: int, write: bool = False):
        """np.uint8 view of the VRAM behind [bus_addr, bus_addr + size), which must lie
        in one BAR's VRAM reachable from endpoint `requester`; else PeerFault."""
        i = bisect.bisect_right(self._bar_starts, bus_addr) - 1
        owner = self._by_bar[i] if i >= 0 else None
        if owner is None or bus_addr >= owner.bar0 + owner.bar0_size or size < 0:
            raise PeerFault(bus_addr, "no BAR at this address")
        off = bus_addr - owner.bar0
        if off >= owner.vram.size:
            raise PeerFault(bus_addr, f"beyond {owner.name}'s VRAM")
        if off + size > owner.vram.size:
            raise PeerFault(owner.bar0 + owner.vram.size, f"beyond {owner.name}'s VRAM")
        req = self.endpoints[requester]
        if self.routes[requester][owner.index][0] == P2PDMA_MAP_NOT_SUPPORTED:
            raise PeerFault(bus_addr, f"P2P not supported between {req.name} and {owner.name}"
                                      " (no common upstream bridge or whitelisted host bridge)")
        with self._lock:
            counts = self._written if write else self._read
            counts[requester][owner.index] += size
        return owner.vram.mem[off:off + size]

    # ----------------------------------------------------------------- reporting
    def stats(self) -> dict:
        """{"gpuR->gpuO": {"read_bytes", "write_bytes"}} for every requester/owner pair."""
        with self._lock:
            return {f"{r.name}->{o.name}": {"read_bytes": self._read[r.index][o.index],
                                            "write_bytes": self._written[r.index][o.index]}
                    for r in self.endpoints for o in self.endpoints}

    def describe(self) -> list:
        """An lspci -t style tree, then the P2P map type and distance of every GPU pair."""
        lines = [f"PCIe layout {self.layout!r}"]

        def visit(node, prefix, last):
            lines.append(f"{prefix}{'`-' if last else '+-'}{node.bdf} {self._label(node)}")
            for i, child in enumerate(node.children):
                visit(child, prefix + ("  " if last else "| "), i == len(node.children) - 1)

        for hb in self.host_bridges:
            lines.append(f"[{hb.bdf[:7]}] {self._label(hb)}")
            for i, rp in enumerate(hb.children):
                visit(rp, "", i == len(hb.children) - 1)
        for a in self.endpoints:
            for b in self.endpoints[a.index + 1:]:
                map_type, dist = self.routes[b.index][a.index]
                lines.append(f"P2P {a.name} <-> {b.name}: {P2PDMA_MAP_NAMES[map_type]}, "
                             f"distance {dist}")
        return lines

    @staticmethod
    def _label(node) -> str:
        label = f"{node.kind} {node.name}"
        if isinstance(node, HostBridge):
            label += " (P2P whitelisted)" if node.whitelisted else ""
        elif isinstance(node, Endpoint):
            label += (f" BAR0 {node.bar0:#x} [size={_size(node.bar0_size)}]"
                      f" VRAM {_size(node.vram.size)}")
        elif node.acs_redirect:
            label += " (ACS redirect)"
        return label
