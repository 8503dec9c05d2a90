"""`pvgpu smi`: what the host's GPUs are doing and who uses them, like nvidia-smi.

It reads the host's admin endpoint (spec §13; transport/admin.py), which only the host's
user can reach: every device and every session. A one-shot run takes two `stats`
samples `SAMPLE_S` apart and prints one table; `--loop S` redraws it in place every S
seconds (ANSI home + clear) until Ctrl-C; `--json` prints one JSON document instead.

Pure parts, tested without a host: `summarise(cur, prev)` turns two `stats` replies into
rows (utilisation over the time between them), `render(summary)` into the text.
Utilisation of an engine is the growth of its busy time over the growth of the device's
clock; a session's share of an engine is the growth of its own jobs' busy time over the
same interval. Without a previous sample the devices show the scheduler's recent window
and the sessions no share.
"""

from __future__ import annotations

import json
import os
import sys
import time

ENGINES = ("compute", "copy0", "copy1")
SAMPLE_S = 0.5  # one-shot: the interval the utilisation is measured over
CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen


class SmiError(Exception):
    """A one-line reason `pvgpu smi` cannot show anything."""


# ---------------------------------------------------------------------- endpoints
def resolve(endpoint: str | None = None, admin_endpoint: str | None = None) -> tuple:
    """-> (host endpoint or None, admin endpoint): `admin_endpoint` as given, else the one
    beside `endpoint` (or the default endpoint), by spec [CTL-ADMIN-2]. SmiError if none."""
    from pvgpu.transport.admin import admin_endpoint_for
    from pvgpu.transport.channel import ChannelError, default_endpoint
    if admin_endpoint:
        return endpoint, admin_endpoint
    try:
        endpoint = endpoint or default_endpoint()
    except ChannelError as e:
        raise SmiError(str(e)) from None
    try:
        return endpoint, admin_endpoint_for(endpoint)
    except ValueError as e:
        raise SmiError(str(e)) from None


def connect(endpoint: str | None = None, admin_endpoint: str | None = None, timeout: float = 5.0):
    """-> a pvgpu.transport.admin.AdminClient; SmiError with the reason when there is no host,
    no admin socket or no permission."""
    from pvgpu.transport.admin import AdminClient, AdminError
    endpoint, admin = resolve(endpoint, admin_endpoint)
    try:
        return AdminClient(admin, timeout=timeout)
    except AdminError as e:
        host_path = endpoint[len("ipc://"):] if endpoint and endpoint.startswith("ipc://") else None
        if "no admin socket" in str(e) and host_path and not os.path.exists(host_path):
            raise SmiError(f"no host at {endpoint}; start one with `pvgpu host`") from None
        raise SmiError(str(e)) from None


class DeviceStats:
    """One device's full statistics from the admin endpoint, in GET_STATS's shape: what a
    monitor of every vGPU reads (the demo, `bench sched`), which a guest may not
    ([CMD-STATS-4])."""

    def __init__(self, admin_endpoint: str, device: int = 0, timeout: float = 10.0):
        from pvgpu.transport.admin import AdminClient
        self.client = AdminClient(admin_endpoint, timeout=timeout)
        self.device = device

    def stats(self) -> dict:
        return self.client.request("stats")["devices"][self.device]

    def close(self) -> None:
        self.client.close()


# ---------------------------------------------------------------------- pure
def _rate(cur: int, prev: int | None, span: int) -> float | None:
    if prev is None or span <= 0:
        return None
    return max(0.0, min(1.0, (cur - prev) / span))


def _who(peer) -> str:
    if not peer:
        return "-"
    if peer.get("transport") == "ipc":
        return str(peer.get("pid", "-"))
    return str(peer.get("address", "-"))


def summarise(cur: dict, prev: dict | None = None) -> dict:
    """Two admin `stats` replies (prev may be None) -> {host, interval_s, devices: [{index,
    name, vram_used, vram_total, evicted_bytes, sessions, utilisation: {engine: 0..1}}],
    sessions: [{device, id, name, pid (or tcp address), vgpu, contexts, vram_bytes,
    evicted_bytes, share: {engine: 0..1 or None}}]}."""
    pdev = {d["device"]: d for d in (prev or {}).get("devices", [])}
    devices, spans = [], {}
    for d in cur.get("devices", []):
        idx, mem, p = d["device"], d.get("mem", {}), pdev.get(d["device"])
        span = d["now_ns"] - p["now_ns"] if p else 0
        spans[idx] = span
        util = {}
        for e in ENGINES:
            eng = d.get("engines", {}).get(e, {})
            if p is not None:
                util[e] = _rate(eng.get("busy_ns", 0),
                                p.get("engines", {}).get(e, {}).get("busy_ns", 0), span)
            else:  # the scheduler's recent window, summed over the vGPUs
                util[e] = min(1.0, sum(v.get("utilisation", 0.0)
                                       for v in eng.get("vgpus", {}).values()))
        total = mem.get("vram_size", d.get("vram_size", 0))
        devices.append({"index": idx, "name": d.get("name", f"gpu{idx}"),
                        "vram_total": total, "vram_used": total - mem.get("vram_free", total),
                        "evicted_bytes": mem.get("evicted_bytes", 0), "utilisation": util,
                        "sessions": 0})
    prev_busy = {}
    for s in (prev or {}).get("sessions", []):
        for u in s.get("devices", []):
            prev_busy[(s["id"], u["device"])] = u.get("busy_ns", {})
    by_index = {d["index"]: d for d in devices}
    sessions = []
    for s in cur.get("sessions", []):
        used = [u for u in s.get("devices", []) if u.get("contexts")]
        for u in used or [None]:
            row = {"device": None, "id": s["id"], "name": s.get("name", ""),
                   "pid": _who(s.get("peer")), "vgpu": s.get("vgpu", "default"), "contexts": 0,
                   "vram_bytes": 0, "evicted_bytes": 0, "share": {e: None for e in ENGINES}}
            if u is not None:
                dev = u["device"]
                old = prev_busy.get((s["id"], dev))
                busy = u.get("busy_ns", {})
                row.update(device=dev, contexts=len(u["contexts"]), vram_bytes=u["vram_bytes"],
                           evicted_bytes=u["evicted_bytes"],
                           share={e: _rate(busy.get(e, 0), None if old is None else old.get(e, 0),
                                           spans.get(dev, 0)) for e in ENGINES})
                if dev in by_index:
                    by_index[dev]["sessions"] += 1
            sessions.append(row)
    sessions.sort(key=lambda r: (r["device"] is None, r["device"] or 0, r["id"]))
    host = cur.get("host", {})
    interval = None
    if prev is not None and spans:
        interval = round(max(spans.values()) / 1e9, 3)
    return {"host": host, "interval_s": interval, "devices": devices, "sessions": sessions}


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.0f} %"


def render(summary: dict, width: int = 107) -> str:
    """The table of a `summarise` result (plain text, no colour)."""
    host = summary.get("host", {})
    what = (f"over {summary['interval_s']:g} s" if summary.get("interval_s")
            else "over the scheduler's last periods")
    lines = [f"pvgpu smi   host pid {host.get('pid', '?')}, up {host.get('uptime_s', 0):.0f} s, "
             f"{' '.join(host.get('endpoints', []))}",
             f"utilisation {what}", "=" * width,
             f"{'GPU':>3}  {'Name':<16}{'VRAM used / total':>24}{'Evicted':>12}"
             f"{'Compute':>9}{'Copy0':>8}{'Copy1':>8}{'Sessions':>10}",
             "-" * width]
    for d in summary.get("devices", []):
        u = d["utilisation"]
        vram = f"{_size(d['vram_used'])} / {_size(d['vram_total'])}"
        lines.append(f"{d['index']:>3}  {d['name'][:15]:<16}{vram:>24}{_size(d['evicted_bytes']):>12}"
                     f"{_pct(u['compute']):>9}{_pct(u['copy0']):>8}{_pct(u['copy1']):>8}"
                     f"{d['sessions']:>10}")
    lines += ["=" * width, "Sessions",
              f"{'GPU':>3}  {'Session':<9}{'Guest':<16}{'PID / address':<20}{'vGPU':<10}"
              f"{'Ctx':>4}{'VRAM':>10}{'Evicted':>10}{'Compute':>9}{'Copy0':>7}{'Copy1':>7}",
              "-" * width]
    rows = summary.get("sessions", [])
    if not rows:
        lines.append("  no sessions")
    for s in rows:
        sh = s["share"]
        gpu = "-" if s["device"] is None else str(s["device"])
        lines.append(f"{gpu:>3}  {s['id'][:8]:<9}{s['name'][:15]:<16}{s['pid'][:19]:<20}"
                     f"{s['vgpu'][:9]:<10}{s['contexts']:>4}{_size(s['vram_bytes']):>10}"
                     f"{_size(s['evicted_bytes']):>10}{_pct(sh['compute']):>9}"
                     f"{_pct(sh['copy0']):>7}{_pct(sh['copy1']):>7}")
    return "\n".join(lines)


# ---------------------------------------------------------------------- the command
def run(endpoint: str | None = None, admin_endpoint: str | None = None, *,
        loop: float | None = None, as_json: bool = False, out=None) -> int:
    """`pvgpu smi`: -> exit code (0; 1 with a one-line error on stderr)."""
    from pvgpu.transport.admin import AdminError
    out = out or sys.stdout
    try:
        client = connect(endpoint, admin_endpoint)
    except SmiError as e:
        print(f"pvgpu smi: {e}", file=sys.stderr)
        return 1
    try:
        prev = client.request("stats")
        if loop is None:
            time.sleep(SAMPLE_S)
            summary = summarise(client.request("stats"), prev)
            out.write((json.dumps(summary, indent=1) if as_json else render(summary)) + "\n")
            return 0
        summary = summarise(prev)
        while True:
            text = json.dumps(summary) if as_json else CLEAR + render(summary)
            out.write(text + "\n")
            out.flush()
            time.sleep(loop)
            cur = client.request("stats")
            summary = summarise(cur, prev)
            prev = cur
    except KeyboardInterrupt:
        return 0
    except AdminError as e:
        print(f"pvgpu smi: {e}", file=sys.stderr)
        return 1
    finally:
        client.close()
