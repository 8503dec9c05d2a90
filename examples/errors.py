"""Device errors are Python exceptions named after the device error.

A kernel that writes through an unmapped device address faults on the GPU; the error
surfaces at the next synchronizing call, and the context keeps working afterwards.

    python examples/errors.py [ENDPOINT]
"""

import sys

import numpy as np

import pvgpu


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with pvgpu.connect(argv[0] if argv else None) as conn:
        with conn.devices[0].create_context() as ctx:
            x = ctx.to_device(np.arange(8, dtype=np.float32))
            ctx.launch("fill", grid=1, block=8, args=(0xDEAD_0000_0000, 1.0, 8))
            try:
                ctx.synchronize()
            except pvgpu.PageFaultError as e:
                print(f"caught {type(e).__name__}: {e}")
                print(f"  faulting address {e.address:#x}, access {e.access}")
                if e.event is not None:  # the device's event-queue report of the fault
                    print(f"  reported on the event queue: {e.event}")
                print(f"  context faulted: {ctx.faulted} ({len(ctx.faults)} fault(s))")
            try:
                ctx.empty(1 << 40, np.uint8)
            except pvgpu.OutOfMemoryError as e:
                print(f"caught {type(e).__name__}: {e}")
            print("the context still works:", x.to_host())


if __name__ == "__main__":
    main()
