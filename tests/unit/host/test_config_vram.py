"""host/config.py check_vram: VRAM per device is a positive number of pages and all
devices' VRAM fits in the machine's memory (emulated VRAM is host memory)."""

import pytest

from pvgpu.host.config import ConfigError, check_vram, physical_memory


def test_a_size_of_whole_pages_that_fits_is_taken():
    assert check_vram(1 << 30, 2, memory=4 << 30) == 1 << 30
    assert check_vram(4096, 8, memory=1 << 20) == 4096


@pytest.mark.parametrize("size", [0, -4096, 100, 4097])
def test_not_whole_pages_is_refused(size):
    with pytest.raises(ConfigError, match="positive multiple of 4 KiB"):
        check_vram(size, 2, memory=1 << 40)


def test_more_than_the_machine_has_is_refused():
    with pytest.raises(ConfigError, match=r"--vram 64 GiB for 2 GPU\(s\) needs 128 GiB .* 16 GiB"):
        check_vram(64 << 30, 2, memory=16 << 30)


def test_the_machine_says_how_much_memory_it_has():
    assert physical_memory() > 0
