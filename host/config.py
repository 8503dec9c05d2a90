"""Host scheduling configuration: the policy, its parameters and the vGPUs (Gdev's model).

A vGPU is a named slice of each device: a compute-bandwidth share, a copy-bandwidth share
and a memory share, in percent (spec §9). They come from the command line

    pvgpu host --sched band --vgpu A:compute=50,copy=50,mem=50 --vgpu B:compute=50

(omitted shares default to 100) or from a JSON file (`--vgpu-config FILE`):

    {"sched": "band", "job_timeout_ms": 10000,
     "vgpus": [{"name": "A", "compute": 50, "copy": 50, "mem": 50}, {"name": "B", ...}]}

Command-line options override the file. Without vGPUs every guest shares the device's
"default" vGPU (100 % of everything).

`check_vram` vets the size of each device's VRAM before any is allocated.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field

from pvgpu.host.kmd.sched import (DEFAULT_HW_LIMIT, DEFAULT_PERIOD_NS, DEFAULT_TIME_BUFFER_NS,
                            DEFAULT_TIMEOUT_NS, POLICIES, VgpuShares)
from pvgpu.host.kmd.errors import InvalidArgument
from pvgpu.host.hw.regs import PAGE_SIZE

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
SHARE_KEYS = ("compute", "copy", "mem")


class ConfigError(ValueError):
    """A bad --vgpu / --sched / config-file value (the message says which and why)."""


@dataclass
class SchedConfig:
    policy: str = "fifo"
    hw_limit: int = DEFAULT_HW_LIMIT
    job_timeout_ms: int = DEFAULT_TIMEOUT_NS // 1_000_000
    time_buffer_us: int = DEFAULT_TIME_BUFFER_NS // 1_000
    period_ms: int = DEFAULT_PERIOD_NS // 1_000_000
    vgpus: list = field(default_factory=list)  # of VgpuShares

    def validate(self) -> "SchedConfig":
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown scheduling policy {self.policy!r}; one of {', '.join(POLICIES)}")
        for what, lo in (("hw_limit", 1), ("job_timeout_ms", 1), ("period_ms", 1),
                         ("time_buffer_us", 0)):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ConfigError(f"{what} must be an integer >= {lo}, not {v!r}")
        names = [v.name for v in self.vgpus]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"vGPU {sorted(dup)[0]!r} is configured twice")
        return self

    def kmd_kwargs(self) -> dict:
        """Keyword arguments for pvgpu.host.kmd.device.KmdDevice."""
        return {"policy": self.policy, "hw_limit": self.hw_limit,
                "job_timeout_ns": self.job_timeout_ms * 1_000_000,
                "time_buffer_ns": self.time_buffer_us * 1_000,
                "period_ns": self.period_ms * 1_000_000, "vgpus": tuple(self.vgpus)}

    def describe(self) -> str:
        if not self.vgpus:
            return f"{self.policy} scheduling, no vGPUs (one shared default)"
        parts = ", ".join(f"{v.name} {v.compute}/{v.copy}/{v.mem}" for v in self.vgpus)
        return f"{self.policy} scheduling, vGPUs (compute/copy/mem %): {parts}"


def physical_memory() -> int | None:
    """This machine's physical memory in bytes (None if the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


def check_vram(size: int, gpus: int, memory: int | None = None) -> int:
    """-> size, if every one of `gpus` devices can have `size` bytes of VRAM: a positive
    multiple of the page size, and all of it within the machine's physical `memory`
    (default: physical_memory()), since emulated VRAM is host memory. Else ConfigError."""
    if size <= 0 or size % PAGE_SIZE:
        raise ConfigError(f"--vram {size}: VRAM per device must be a positive multiple of "
                          f"{PAGE_SIZE // 1024} KiB (try 256M or 1G)")
    memory = physical_memory() if memory is None else memory
    if memory is not None and size * gpus > memory:
        raise ConfigError(f"--vram {_gib(size)} for {gpus} GPU(s) needs {_gib(size * gpus)} "
                          f"of host memory; this machine has {_gib(memory)}: give a smaller "
                          "--vram or fewer --gpus")
    return size


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def _shares(name: str, values: dict) -> VgpuShares:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"bad vGPU name {name!r}: 1-32 letters, digits, '_', '.' or '-'")
    unknown = set(values) - set(SHARE_KEYS)
    if unknown:
        raise ConfigError(f"vGPU {name}: unknown share {sorted(unknown)[0]!r} "
                          f"(shares are {', '.join(SHARE_KEYS)})")
    try:
        return VgpuShares(name, **{k: values[k] for k in SHARE_KEYS if k in values})
    except InvalidArgument as e:
        raise ConfigError(str(e)) from None


def parse_vgpu(text: str) -> VgpuShares:
    """'NAME:compute=50,copy=50,mem=50' (shares optional, in percent, default 100)."""
    name, _, rest = text.partition(":")
    values = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, val = item.partition("=")
        if not eq:
            raise ConfigError(f"--vgpu {text!r}: {item!r} is not KEY=PERCENT")
        try:
            values[key.strip()] = int(val.rstrip("%"))
        except ValueError:
            raise ConfigError(f"--vgpu {text!r}: {val!r} is not an integer percent") from None
    return _shares(name.strip(), values)


def load_config(path: str) -> SchedConfig:
    """Read a JSON scheduling configuration (see the module docstring)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be an object")
    cfg = SchedConfig()
    known = {"sched", "hw_limit", "job_timeout_ms", "time_buffer_us", "period_ms", "vgpus"}
    unknown = set(data) - known
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r}")
    if "sched" in data:
        cfg.policy = data["sched"]
    for key in ("hw_limit", "job_timeout_ms", "time_buffer_us", "period_ms"):
        if key in data:
            setattr(cfg, key, data[key])
    vgpus = data.get("vgpus", [])
    if not isinstance(vgpus, list):
        raise ConfigError(f"{path}: 'vgpus' must be a list")
    for entry in vgpus:
        if not isinstance(entry, dict) or "name" not in entry:
            raise ConfigError(f"{path}: every vGPU needs a 'name'")
        values = {k: v for k, v in entry.items() if k != "name"}
        cfg.vgpus.append(_shares(entry["name"], values))
    return cfg.validate()
