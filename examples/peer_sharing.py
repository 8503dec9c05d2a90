"""A buffer shared between the two GPUs: peer-to-peer when the host's PCIe fabric allows
it, through system memory otherwise (the same code runs on every `pvgpu host --topology`).

    python examples/peer_sharing.py [ENDPOINT]

GPU 0 computes a buffer; GPU 1 imports it (the handle could as well go to another guest
process: str(handle)), reads it with a kernel and writes into it; a peer copy brings it
back to GPU 1's own memory. The host orders the two GPUs' work on the shared buffer.
"""

import sys

import numpy as np

import pvgpu


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    n = 1 << 20
    with pvgpu.connect(argv[0] if argv else None) as conn:
        gpu0, gpu1 = conn.devices
        print(f"GPU 1 -> GPU 0: {gpu1.peer_info(gpu0)}")
        with gpu0.create_context("producer") as c0, gpu1.create_context("consumer") as c1:
            if gpu1.can_access_peer(gpu0):
                c1.enable_peer_access(gpu0)
            x = c0.to_device(np.arange(n, dtype=np.float32))
            c0.launch("scale", n // 256, 256, (x, x, 2.0, n))  # x = 2 * i, on GPU 0

            shared = c1.import_array(x.export(), (n,), np.float32)
            y = c1.empty(n)
            c1.launch("scale", n // 256, 256, (y, shared, 0.5, n))  # waits for GPU 0's write
            c1.launch("fill", n // 256, 256, (shared, 7.0, n))  # GPU 1 writes GPU 0's buffer
            assert np.array_equal(y.to_host(), np.arange(n, dtype=np.float32))
            assert np.all(x.to_host() == 7.0)
            print(f"GPU 1 read and wrote GPU 0's buffer in place ({shared.placement} memory)")

            z = c1.empty(n)
            how = c1.memcpy_peer(z, x)
            assert np.all(z.to_host() == 7.0)
            print(f"memcpy_peer GPU 0 -> GPU 1: {how}")


if __name__ == "__main__":
    main()
