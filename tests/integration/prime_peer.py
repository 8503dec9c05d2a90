"""A second guest for tests/integration/test_prime.py: imports a buffer handle on device 1
and prints what it found, as one JSON line. Usage:
    python prime_peer.py ENDPOINT HANDLE N [hold]
With `hold` it prints "ready" after the import and then waits to be killed."""

import json
import sys
import time

import numpy as np

from pvgpu import guest


def main(endpoint, handle, n, hold=False):
    with guest.connect(endpoint, mem_size=64 << 20, heartbeat_ms=200) as conn:
        d0, d1 = conn.devices
        ctx = d1.create_context("peer")
        if d1.can_access_peer(d0):
            ctx.enable_peer_access(d0)
        try:
            arr = ctx.import_array(handle, (n,), np.float32)
        except guest.PermissionDeniedError as e:
            print(json.dumps({"refused": str(e)}), flush=True)
            return 0
        if hold:
            print("ready", flush=True)
            time.sleep(60)
        out = ctx.empty(n)
        ctx.launch("scale", n // 256, 256, (out, arr, 2.0, n))  # read the exporter's memory
        ctx.launch("scale", n // 256, 256, (arr, arr, 3.0, n))  # and write it
        got = out.to_host()
        print(json.dumps({"placement": arr.placement, "sum": float(got.sum(dtype=np.float64)),
                          "first": float(got[0]), "last": float(got[-1])}), flush=True)
        arr.free()
        return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), len(sys.argv) > 4))
