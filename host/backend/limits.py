"""The wire's per-context limits, as the KMD's ContextLimits.

The KMD knows nothing of the guest protocol: a context it creates is bounded only by the
hardware unless its creator says otherwise. Every context the backend creates for a guest
gets GUEST_CONTEXT_LIMITS: the user VA range of spec/pvgpu.md §6.3 and the limits the
commands of §6 promise (VA_RESERVE alignment and count, MEM_MAP count, imports, LAUNCH
arguments). The per-session counts of §10.3 (sessions, contexts, events, segment ids) are
checked where those objects live: Backend, ComputeDevice, ShmTable.
"""

from __future__ import annotations

from pvgpu.host.kmd.limits import ContextLimits
from pvgpu.spec import wire

GUEST_CONTEXT_LIMITS = ContextLimits(
    va_base=wire.VA_USER_BASE, va_limit=wire.VA_USER_LIMIT, max_va_align=wire.MAX_VA_ALIGN,
    max_va_reservations=wire.MAX_VA_RESERVATIONS, max_va_mappings=wire.MAX_VA_MAPPINGS,
    max_imports=wire.MAX_IMPORTS, max_kernel_args=wire.MAX_KERNEL_ARGS)
