"""A remote guest: tcp, authenticated and encrypted with CurveZMQ keys from `pvgpu keygen`,
in the inline memory model (nothing shared with the host, so it works across machines).

    python examples/remote_guest.py            # makes keys and starts a tcp host of its own

or against a host of yours (the keys are made on the host here; the guest's machine needs
keys/host.key and keys/guest.key_secret):

    pvgpu keygen keys --name host && pvgpu keygen keys --name guest
    mkdir guests && cp keys/guest.key guests/  # the guests this host accepts
    pvgpu host --listen tcp://0.0.0.0:5555 --curve-secret-key keys/host.key_secret \\
        --authorized-keys guests/
    python examples/remote_guest.py tcp://HOST:5555 --server-key keys/host.key \\
        --client-key keys/guest.key_secret    # or set PVGPU_SERVER_KEY and PVGPU_CLIENT_KEY
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from pvgpu import guest
from pvgpu.procs import HostProcess


def run(endpoint: str, server_key, client_key) -> None:
    n = 1 << 16
    x = np.linspace(-1, 1, n, dtype=np.float32)
    with guest.connect(endpoint, memory="inline", server_key=server_key, client_key=client_key,
                       name="remote-example") as conn:
        dev = conn.devices[0]
        session = dev.stats()["session"]
        print(f"connected to {endpoint} as session {session['id']}, key {session['key']}")
        with dev.create_context() as ctx:
            a = ctx.to_device(x)
            ctx.launch("saxpy", n // 256, 256, (3.0, a, a, n))  # a = 3a + a, on the host's GPU
            assert np.array_equal(a.get(), 4 * x)
    print(f"saxpy of {n} floats over CURVE-encrypted tcp matches numpy")


def keygen(directory: str, name: str) -> None:
    subprocess.run([sys.executable, "-m", "pvgpu", "keygen", directory, "--name", name],
                   check=True, stdout=subprocess.DEVNULL)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("endpoint", nargs="?", help="tcp://HOST:PORT of a running host")
    ap.add_argument("--server-key", help="the host's public key (host.key)")
    ap.add_argument("--client-key", help="this guest's key pair (guest.key_secret)")
    args = ap.parse_args(argv)
    if args.endpoint:
        run(args.endpoint, args.server_key, args.client_key)
        return
    with tempfile.TemporaryDirectory(prefix="pvgpu-example-") as d:
        keys, guests = os.path.join(d, "keys"), os.path.join(d, "guests")
        keygen(keys, "host")
        keygen(keys, "guest")
        os.makedirs(guests)
        os.link(os.path.join(keys, "guest.key"), os.path.join(guests, "guest.key"))
        with HostProcess(["tcp://127.0.0.1:0"], vram="64M", extra_args=[
                 "--curve-secret-key", os.path.join(keys, "host.key_secret"),
                 "--authorized-keys", guests]) as host:
            run(host.endpoint, os.path.join(keys, "host.key"),
                os.path.join(keys, "guest.key_secret"))


if __name__ == "__main__":
    main()
