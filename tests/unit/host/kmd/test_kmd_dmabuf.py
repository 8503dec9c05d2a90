"""pvgpu.host.kmd.dmabuf: lifetime, attach/map/unmap/detach, move_notify, revoke, PRIME reuse."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pvgpu.host.kmd.dmabuf import (SG_PEER, SG_SYSTEM, AttachRefused, DmaBuf, DmaBufCache,
                             DmaBufError, DmaBufReleased, DmaBufRevoked, SgTable)
from pvgpu.host.kmd.errors import KmdError
from pvgpu.host.kmd.resv import DMA_RESV_USAGE_WRITE, DmaResv

SIZE = 0x3000


class FakeExporter:
    """Exporter ops of a device whose buffer sits at `base` (moved by move())."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)  # importers it will not attach
        self.base = 0x10_0000
        self.calls = []
        self.mapped = {}  # attachment -> [sgt], what the exporter thinks is mapped
        self.released = []
        self.on_map = None  # hook run inside map (to race a move with it)

    def _live(self, buf):
        assert not buf.released, f"exporter op on released {buf!r}"

    def attach(self, dmabuf, attachment):
        self._live(dmabuf)
        self.calls.append(("attach", attachment.importer))
        if attachment.importer in self.refuse:
            raise AttachRefused(f"{attachment.importer} cannot reach dma-buf {dmabuf.id}")
        attachment.priv = "exporter-priv"

    def detach(self, dmabuf, attachment):
        self._live(dmabuf)
        self.calls.append(("detach", attachment.importer))
        assert not self.mapped.get(attachment), "detach while mapped"

    def map(self, attachment):
        self._live(attachment.dmabuf)
        self.calls.append(("map", self.base))
        kind = SG_PEER if attachment.peer2peer else SG_SYSTEM
        half = attachment.dmabuf.size // 2
        sgt = SgTable([(self.base, half), (self.base + 0x8000, attachment.dmabuf.size - half)],
                      kind, attachment.dmabuf.size)
        self.mapped.setdefault(attachment, []).append(sgt)
        if self.on_map is not None:
            hook, self.on_map = self.on_map, None
            hook()
        return sgt

    def unmap(self, attachment, sgt):
        self._live(attachment.dmabuf)
        self.calls.append(("unmap", sgt.segments[0][0]))
        self.mapped[attachment].remove(sgt)

    def release(self, dmabuf):
        self.released.append(dmabuf)

    def move(self, buf):
        self.base += 0x100_0000
        buf.move_notify()


class FakeImporter:
    def __init__(self):
        self.notified = []

    def move_notify(self, attachment):
        self.notified.append(attachment)


def export(exp=None, size=SIZE, resv=None):
    exp = exp or FakeExporter()
    return DmaBuf(exp, "bo", size, resv, exporter="gpu0"), exp


# ---------------------------------------------------------------------------- SgTable
def test_sg_table_covers_the_buffer():
    sgt = SgTable([(0x1000, 0x1000), (0x8000, 0x2000)], SG_PEER, 0x3000)
    assert (sgt.size, sgt.kind, sgt.segments) == (0x3000, "peer", [(0x1000, 0x1000),
                                                                   (0x8000, 0x2000)])
    with pytest.raises(ValueError, match="covers"):
        SgTable([(0, 0x1000)], SG_SYSTEM, 0x2000)
    for segs in ([], [(0, 0)], [(-1, 0x1000)]):
        with pytest.raises(ValueError):
            SgTable(segs, SG_SYSTEM)
    with pytest.raises(ValueError, match="kind"):
        SgTable([(0, 0x1000)], "vram")


# ---------------------------------------------------------------------------- lifetime
def test_export_get_put_releases_once():
    buf, exp = export()
    assert buf.refcount == 1 and buf.exporter == "gpu0" and buf.priv == "bo"
    assert buf.get() is buf
    assert buf.put() is False and exp.released == []
    assert buf.put() is True and exp.released == [buf] and buf.released
    for use in (buf.get, buf.put, buf.move_notify,
                lambda: buf.attach("gpu1", FakeImporter())):
        with pytest.raises(DmaBufReleased, match=f"dma-buf {buf.id} was released"):
            use()
    assert exp.released == [buf]


def test_ids_are_unique_and_resv_is_shared():
    resv = DmaResv()
    a, _ = export(resv=resv)
    b, _ = export()
    assert a.id != b.id
    assert a.resv is resv and isinstance(b.resv, DmaResv) and b.resv is not resv


def test_errors_are_kmd_errors():
    assert issubclass(DmaBufError, KmdError)
    for e in (DmaBufReleased, DmaBufRevoked, AttachRefused):
        assert issubclass(e, DmaBufError)
    assert DmaBufRevoked().code == "permission"


def test_attachment_holds_a_reference():
    buf, exp = export()
    att = buf.attach("gpu1", FakeImporter(), peer2peer=True)
    assert buf.refcount == 2 and buf.attachments == [att] and att.priv == "exporter-priv"
    assert buf.put() is False and exp.released == []  # the exporter dropped its handle
    att.map()
    att.detach()
    assert exp.released == [buf]
    assert [c[0] for c in exp.calls] == ["attach", "map", "unmap", "detach"]


# ---------------------------------------------------------------------------- attach
def test_refused_attach_leaves_nothing_behind():
    buf, exp = export(FakeExporter(refuse={"gpu1"}))
    with pytest.raises(AttachRefused, match="gpu1 cannot reach"):
        buf.attach("gpu1", FakeImporter())
    assert buf.refcount == 1 and buf.attachments == [] and buf.stats["attaches"] == 0
    assert buf.put() and exp.released == [buf]


def test_revoke_stops_new_attaches_but_keeps_existing():
    buf, exp = export()
    att = buf.attach("gpu1", FakeImporter(), peer2peer=True)
    buf.revoke()
    with pytest.raises(DmaBufRevoked, match="revoked"):
        buf.attach("gpu2", FakeImporter())
    assert att.map().kind == SG_PEER
    att.detach()
    assert buf.refcount == 1 and not buf.released


# ---------------------------------------------------------------------------- map / unmap
def test_map_is_cached_until_unmapped():
    buf, exp = export()
    att = buf.attach("gpu1", FakeImporter())
    sgt = att.map()
    assert att.map() is sgt and att.sgt is sgt and sgt.kind == SG_SYSTEM
    assert buf.stats["maps"] == 1
    att.unmap()
    assert att.sgt is None and exp.mapped[att] == []
    with pytest.raises(DmaBufError, match="not mapped"):
        att.unmap()
    assert att.map() is not sgt and buf.stats == {"attaches": 1, "detaches": 0, "maps": 2,
                                                  "unmaps": 1, "move_notifies": 0}


def test_detached_attachment_is_unusable():
    buf, _ = export()
    att = buf.attach("gpu1", FakeImporter())
    att.detach()
    for use in (att.map, att.unmap, att.detach):
        with pytest.raises(DmaBufError, match="detached"):
            use()


def test_move_notify_invalidates_and_importer_remaps():
    buf, exp = export()
    imp1, imp2 = FakeImporter(), FakeImporter()
    mapped = buf.attach("gpu1", imp1)
    idle = buf.attach("gpu2", imp2)
    old = mapped.map()
    exp.move(buf)
    assert imp1.notified == [mapped] and imp2.notified == [idle]
    assert mapped.stale and mapped.sgt is None and not idle.stale
    new = mapped.map()
    assert not mapped.stale and new.segments[0][0] == old.segments[0][0] + 0x100_0000
    # the stale mapping went back to the exporter before the new one was made
    assert exp.calls[-2:] == [("unmap", old.segments[0][0]), ("map", exp.base)]
    assert exp.mapped[mapped] == [new]
    assert buf.stats["move_notifies"] == 1


def test_stale_mapping_is_unmapped_by_detach_and_unmap():
    buf, exp = export()
    a, b = buf.attach("gpu1", FakeImporter()), buf.attach("gpu2", FakeImporter())
    a.map(), b.map()
    exp.move(buf)
    a.unmap()
    b.detach()
    assert exp.mapped[a] == [] and exp.mapped[b] == []


def test_move_during_map_maps_again():
    buf, exp = export()
    imp = FakeImporter()
    att = buf.attach("gpu1", imp)
    exp.on_map = lambda: exp.move(buf)  # the exporter evicts while the importer maps
    sgt = att.map()
    assert sgt.segments[0][0] == exp.base and exp.mapped[att] == [sgt]
    assert imp.notified == [att] and not att.stale
    assert buf.stats["maps"] == 2 and buf.stats["unmaps"] == 1


def test_resv_is_the_exported_buffers():
    resv = DmaResv()
    buf, _ = export(resv=resv)

    class F:
        device, engine, seq, signaled = "gpu0", 0, 1, False
    resv.add_fence(F(), DMA_RESV_USAGE_WRITE)
    att = buf.attach("gpu1", FakeImporter())
    assert len(att.dmabuf.resv.implicit_deps(write=False)) == 1


# ---------------------------------------------------------------------------- PRIME reuse
def test_re_export_returns_the_same_dmabuf():
    cache, exp = DmaBufCache(), FakeExporter()
    made = []

    def factory():
        made.append(DmaBuf(exp, "bo", SIZE))
        return made[-1]
    a = cache.export("bo", factory)
    b = cache.export("bo", factory)
    assert a is b and a.refcount == 2 and len(made) == 1 and cache.lookup("bo") is a
    a.put(), b.put()
    assert exp.released == [a] and cache.lookup("bo") is None and len(cache) == 0
    c = cache.export("bo", factory)
    assert c is not a and len(made) == 2


def test_revoked_export_is_replaced():
    cache, exp = DmaBufCache(), FakeExporter()
    a = cache.export("bo", lambda: DmaBuf(exp, "bo", SIZE))
    att = a.attach("gpu1", FakeImporter())
    a.revoke()
    b = cache.export("bo", lambda: DmaBuf(exp, "bo", SIZE))
    assert b is not a and cache.lookup("bo") is b
    a.put(), att.detach()  # the revoked one goes; its release leaves b named
    assert exp.released == [a] and cache.lookup("bo") is b


# ---------------------------------------------------------------------------- property
OPS = ("export", "get", "put", "attach", "detach", "map", "move")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 7)), max_size=60))
def test_any_interleaving_releases_exactly_once_at_zero(ops):
    """Handles are references (the exporter's and its copies) and attachments. Whatever
    the order, a dma-buf is released exactly when its last handle goes, exactly once, and
    no exporter op ever sees a released dma-buf (FakeExporter asserts it)."""
    exp, cache = FakeExporter(), DmaBufCache()
    refs, atts, bufs = [], [], []
    for op, i in ops:
        if op == "export":
            key = f"bo{i % 2}"
            buf = cache.export(key, lambda: DmaBuf(exp, key, SIZE))
            if buf not in bufs:
                bufs.append(buf)
            refs.append(buf)
        elif op == "get" and refs:
            refs.append(refs[i % len(refs)].get())
        elif op == "put" and refs:
            buf = refs.pop(i % len(refs))
            last = buf.put()
            assert last == (buf not in refs and all(a.dmabuf is not buf for a in atts))
        elif op == "attach" and refs:
            atts.append(refs[i % len(refs)].attach(f"gpu{i}", FakeImporter(), i % 2 == 0))
        elif op == "detach" and atts:
            atts.pop(i % len(atts)).detach()
        elif op == "map" and atts:
            atts[i % len(atts)].map()
        elif op == "move" and (refs or atts):
            (refs + [a.dmabuf for a in atts])[i % (len(refs) + len(atts))].move_notify()
        for buf in bufs:
            held = refs.count(buf) + sum(a.dmabuf is buf for a in atts)
            assert buf.released == (held == 0)
            assert exp.released.count(buf) == (0 if held else 1)
            if held:
                assert buf.refcount == held
    for a in atts:
        a.detach()
    for buf in refs:
        buf.put()
    assert sorted(b.id for b in exp.released) == sorted(b.id for b in bufs)
    assert all(not m for m in exp.mapped.values()) and len(cache) == 0
