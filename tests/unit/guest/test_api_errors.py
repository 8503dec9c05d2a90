"""guest/api/errors.py: one exception hierarchy. Every exception class the guest package
exports, and every one the frontend and the transport define, derives from PvgpuError;
where Python has a built-in for the same failure it derives from that too."""

import importlib
import inspect
import pkgutil

import pytest

from pvgpu import guest
from pvgpu import transport
from pvgpu.guest import frontend
from pvgpu.transport import errors as transport_errors
from pvgpu.transport.errors import PvgpuError


def _exception_classes(module):
    return [obj for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, BaseException)
            and obj.__module__ == module.__name__]


def _defined_in(package):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        yield from _exception_classes(importlib.import_module(info.name))


def test_the_guest_package_exports_the_transports_base():
    assert guest.PvgpuError is PvgpuError


def test_every_exception_the_guest_package_exports_is_a_pvgpu_error():
    exported = [getattr(guest, name) for name in guest.__all__]
    classes = [c for c in exported if inspect.isclass(c) and issubclass(c, BaseException)]
    assert len(classes) > 30  # the walk sees them
    assert [c.__name__ for c in classes if not issubclass(c, PvgpuError)] == []


@pytest.mark.parametrize("package", [transport, frontend], ids=lambda p: p.__name__)
def test_every_exception_of_the_transport_and_the_frontend_is_a_pvgpu_error(package):
    classes = list(_defined_in(package))
    assert transport_errors.GuestMemoryError in classes or package is frontend
    assert [f"{c.__module__}.{c.__name__}" for c in classes if not issubclass(c, PvgpuError)] == []


def test_every_class_of_transport_errors_is_a_pvgpu_error():
    classes = _exception_classes(transport_errors)
    for name in ("ChannelError", "ChannelTimeout", "HostLost", "HostNotFound",
                 "AuthenticationFailed", "GuestMemoryError", "QueueFull", "VirtqError"):
        assert getattr(transport_errors, name) in classes
    assert all(issubclass(c, PvgpuError) for c in classes)


@pytest.mark.parametrize("cls,builtin", [
    (guest.ChannelTimeout, TimeoutError), (guest.OutOfGuestMemory, MemoryError),
    (guest.OutOfRangeError, OverflowError), (transport_errors.GuestMemoryError, ValueError),
    (guest.NotFoundError, LookupError), (guest.PinnedMemoryError, ValueError),
    (guest.HostNotFound, guest.HostLost),
])
def test_errors_stay_what_code_catches_today(cls, builtin):
    assert issubclass(cls, builtin) and issubclass(cls, PvgpuError)


def test_the_transports_host_not_found_becomes_the_apis():
    from pvgpu.guest.api.errors import translate
    mapped = translate(transport_errors.HostNotFound("no host at ipc:///x"))
    assert type(mapped) is guest.HostNotFound and isinstance(mapped, guest.HostLost)
    assert str(mapped) == "no host at ipc:///x"
