"""A memcpy loop in its own process: the contention the bounce-buffer copy path meets
(the guest copies into guest memory while the host's copy engine DMAs out of it)."""

import sys
import time

import numpy as np


def main(nbytes: int, seconds: float) -> None:
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    print("ready", flush=True)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.copyto(dst, src)


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
