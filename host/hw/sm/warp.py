"""Warp instructions: shfl, vote, activemask (spec/isa.md SM-EXEC-4).

They act on the threads of each warp that execute the instruction together, the group's
lanes in that warp (the executor runs every runnable thread at the same PC at once, so a
warp's threads at one instruction are always together). A block's warps are its
WARP_SIZE consecutive threads; the last one may be partial.

shfl follows PTX's shfl.sync: with lane = %laneid, bval = b[4:0], cval = c[4:0] and
segmask = c[12:8], maxLane = (lane & segmask) | (cval & ~segmask), minLane = lane &
segmask, the source lane j is lane - bval (up; in range if j >= maxLane), lane + bval
(down; j <= maxLane), lane ^ bval (bfly; j <= maxLane) or minLane | (bval & ~segmask)
(idx; j <= maxLane). Out of range, or past the end of a partial warp, a lane reads its own
value; d2 says whether the source was in range. A source lane that does not execute the
shfl gives whatever its register holds.
"""

from __future__ import annotations

import numpy as np

from pvgpu.host.hw.sm import values as V
from pvgpu.spec import isa


def _u32(b, v, lanes):
    x = b.at(v, lanes)
    return np.asarray(x).astype(np.int64) & 0xFFFFFFFF


def shfl(b, act, ins) -> None:
    geo = b.geo
    warp, lane_id, _ = geo.warps()
    t, _ = geo.tq()
    lanes = act.idx
    all_lanes = geo.lanes() if lanes is None else lanes
    lane = lane_id if lanes is None else lane_id[lanes]
    tt = t if lanes is None else t[lanes]
    bval = _u32(b, b.val(ins.b), lanes) & 31
    c = _u32(b, b.val(ins.c), lanes)
    cval, seg = c & 31, (c >> 8) & 31
    max_lane = (lane & seg) | (cval & ~seg)
    min_lane = lane & seg
    mode = ins.var
    if mode == isa.VAR_SHFL_UP:
        j = lane - bval
        ok = j >= max_lane
    elif mode == isa.VAR_SHFL_DOWN:
        j = lane + bval
        ok = j <= max_lane
    elif mode == isa.VAR_SHFL_BFLY:
        j = lane ^ bval
        ok = j <= max_lane
    else:
        j = min_lane | (bval & ~seg)
        ok = j <= max_lane
    j = np.where(ok, j, lane)
    src = np.where(tt - lane + j < geo.T, all_lanes - lane + j, all_lanes)
    a = b.val(ins.a)
    if isinstance(a, (np.ndarray, V.Lin)):
        vals = b.full_array(a, np.uint32)[src]
    else:
        vals = a
    b.write_at(ins.d, vals, act)
    if ins.d2 is not None:
        b.write_at(ins.d2, np.broadcast_to(ok, (act.k,)).copy(), act)


def _per_warp(b, act):
    """-> (warp of each active lane, lane id of each, number of warps)."""
    warp, lane_id, nw = b.geo.warps()
    if act.mask is None:
        return warp, lane_id, nw
    idx = act.idx
    return warp[idx], lane_id[idx], nw


def vote(b, act, ins) -> None:
    w, lane, nw = _per_warp(b, act)
    p = b.at(b.val(ins.a), act.idx)
    p = np.broadcast_to(np.logical_xor(p, ins.neg), (act.k,))
    var = ins.var
    if var == isa.VAR_VOTE_BALLOT:
        bits = np.where(p, np.left_shift(1, lane), 0).astype(np.float64)
        mask = np.bincount(w, weights=bits, minlength=nw).astype(np.uint32)
        b.write_at(ins.d, mask[w], act)
        return
    ones = np.bincount(w, weights=p, minlength=nw)
    if var == isa.VAR_VOTE_ANY:
        r = ones[w] > 0
    else:
        total = np.bincount(w, minlength=nw)
        if var == isa.VAR_VOTE_ALL:
            r = ones[w] == total[w]
        else:  # UNI
            r = (ones[w] == 0) | (ones[w] == total[w])
    b.write_at(ins.d, r, act)


def activemask(b, act, ins) -> None:
    w, lane, nw = _per_warp(b, act)
    bits = np.left_shift(1, lane).astype(np.float64)
    mask = np.bincount(w, weights=bits, minlength=nw).astype(np.uint32)
    b.write_at(ins.d, mask[w], act)
