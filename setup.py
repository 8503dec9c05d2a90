"""Package discovery for pyproject.toml: one top-level package, `pvgpu`.

The repository keeps guest/, host/, transport/, spec/ and bench/ at its top, beside pvgpu/;
the distribution installs them as pvgpu.guest, pvgpu.host, pvgpu.transport, pvgpu.spec and
pvgpu.bench, so nothing with a generic name lands in site-packages. Every other setting is
in pyproject.toml.
"""

from setuptools import find_packages, setup

SUBPACKAGES = ("guest", "host", "transport", "spec", "bench")

packages = find_packages(include=["pvgpu", "pvgpu.*"])
for sub in SUBPACKAGES:
    packages += [f"pvgpu.{name}" for name in find_packages(include=[sub, f"{sub}.*"])]

setup(packages=packages, package_dir={f"pvgpu.{sub}": sub for sub in SUBPACKAGES})
