"""Every public name of the guest API has a docstring, so that help() reads well: each
class and function in guest.__all__, and every public method and property of those
classes and of the guest/ classes they inherit from (CuPy's protocol methods too)."""

import inspect

from pvgpu import guest

# dunder methods with behaviour of pvgpu's own, which help() should explain
DOCUMENTED_DUNDERS = {"__getitem__", "__len__", "__array__", "__call__"}


def _undocumented(objects) -> list:
    """The names among `objects` (functions and classes), the guest/ classes they inherit
    from and those classes' public methods and properties that have no docstring."""
    classes = {cls for obj in objects if inspect.isclass(obj) for cls in obj.__mro__
               if cls.__module__.startswith("pvgpu.guest.")}
    missing = [obj.__name__ for obj in objects
               if not inspect.isclass(obj) and not inspect.getdoc(obj)]
    for cls in sorted(classes, key=lambda c: c.__qualname__):
        if not cls.__name__.startswith("_") and not cls.__dict__.get("__doc__"):
            missing.append(cls.__name__)
        for attr, member in vars(cls).items():
            if attr.startswith("_") and attr not in DOCUMENTED_DUNDERS:
                continue
            is_property = isinstance(member, property)
            fn = member.fget if is_property else getattr(member, "__func__", member)
            if (inspect.isfunction(fn) or is_property) and not (fn.__doc__ or "").strip():
                missing.append(f"{cls.__name__}.{attr}")
    return missing


def test_every_public_class_method_and_function_has_a_docstring():
    api = [getattr(guest, name) for name in guest.__all__]
    assert _undocumented([obj for obj in api if inspect.isclass(obj) or callable(obj)]) == []


def test_the_walk_finds_an_undocumented_method():
    class Documented:
        """A class."""

        def method(self):
            pass

    def undocumented_function():
        pass

    Documented.__module__ = "pvgpu.guest.api.example"
    assert _undocumented([Documented, undocumented_function]) == [
        "undocumented_function", "Documented.method"]
