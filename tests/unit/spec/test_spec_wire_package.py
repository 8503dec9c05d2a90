"""spec/wire/ and spec/kernels.py: the wire package re-exports every name of every section,
each number is defined in exactly one place, and the hardware's kernel ABI is one set of
objects whichever module a user imports it from."""

import importlib
import inspect
import types

import pvgpu.spec.kernels
from pvgpu import spec
from pvgpu.spec import wire

SECTIONS = ("ctl", "vq", "dev", "cmd", "evtq")


def _section(name):
    return importlib.import_module(f"pvgpu.spec.wire.{name}")


def _own_names(module):
    """The public names `module` defines itself (not those it imports)."""
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, types.ModuleType) or name == "annotations":
            continue
        if inspect.isfunction(value) or inspect.isclass(value):
            if value.__module__ != module.__name__:
                continue
        elif any(name in vars(m) for m in _imported_from(module)):
            continue
        names.add(name)
    return names


def _imported_from(module):
    src = inspect.getsource(module)
    return [importlib.import_module(m) for m in ("pvgpu.spec.kernels", "pvgpu.spec.wire.cmd")
            if f"from {m} import" in src]


def test_every_section_name_is_a_wire_name():
    for sec in SECTIONS:
        module = _section(sec)
        own = _own_names(module)
        assert len(own) > 5, sec
        for name in own:
            assert getattr(wire, name) is getattr(module, name), (sec, name)


def test_no_name_is_defined_by_two_sections():
    seen = {}
    for sec in SECTIONS:
        for name in _own_names(_section(sec)):
            assert name not in seen, f"{name} is defined in {seen[name]} and {sec}"
            seen[name] = sec
    assert not set(seen) & _own_names(spec.kernels)


def test_the_kernel_abi_is_re_exported_as_the_same_objects():
    own = _own_names(spec.kernels)
    assert {"BUILTIN_KERNELS", "KERNEL_WRITTEN_ARGS", "ARG_PTR", "ACCESS_READ", "ACCESS_NAMES",
            "KernelSignature", "BURN_FOREVER"} <= own
    for name in own:
        assert getattr(wire, name) is getattr(spec.kernels, name), name
    assert wire.BUILTIN_KERNELS[wire.KERNEL_FILL].args[0] == ("dst", wire.ARG_PTR)


def test_wire_keeps_the_names_its_users_import():
    # a sample of every section, through both import styles
    from pvgpu.spec.wire import (CMD_LAUNCH, CTRL_HDR_SIZE, EVTQ_ENTRY_SIZE, OP_HELLO,  # noqa: F401
                           STATUS_DRIVER_OK, VIRTQ_DESC_SIZE, pack_ctrl_hdr, virtq_used_size)
    assert wire.EVTQ_ENTRY_SIZE == wire.CTRL_HDR_SIZE + 40 == 64
    assert wire.unpack_ctrl_hdr(wire.pack_ctrl_hdr(wire.CMD_NOP, ctx_id=3))[3] == 3
    assert wire.virtq_used_size(8) == 6 + 8 * wire.VIRTQ_USED_ELEM_SIZE
