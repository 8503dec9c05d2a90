"""pvgpu wire constants, version 0.1 — the single source of every number on the wire.

Both sides import from here; no wire number is written anywhere else. The package is
split by section of spec/pvgpu.md, and this module re-exports every name of every
section, so that `from pvgpu.spec.wire import X` and `wire.X` need not know which one holds X:

  ctl   CTL control channel (ZeroMQ + msgpack), MEM guest memory models   §2, §3
  vq    VQ  split virtqueue (virtio 1.x §2.7)                              §4
  dev   DEV device id, status, features, config, queues                   §5
  cmd   CMD device commands and responses, FENCE, KRN, ERR                 §6-§9
  evtq  the event queue                                                    §5.7
  admin the host's admin endpoint (CTL-ADMIN)                              §13

The built-in kernel table and the fault access bits are the hardware's kernel ABI; they
live in spec/kernels.py and `cmd` re-exports them.
"""

from pvgpu.spec.wire.ctl import *  # noqa: F401,F403
from pvgpu.spec.wire.vq import *  # noqa: F401,F403
from pvgpu.spec.wire.dev import *  # noqa: F401,F403
from pvgpu.spec.wire.cmd import *  # noqa: F401,F403
from pvgpu.spec.wire.evtq import *  # noqa: F401,F403
from pvgpu.spec.wire.admin import *  # noqa: F401,F403
