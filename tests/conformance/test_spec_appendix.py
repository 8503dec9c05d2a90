"""spec/pvgpu.md Appendix A is what a host does: a freshly recorded session renders to the
very text of the appendix (tests/appendix_a.py records and renders it)."""

import difflib

import appendix_a


def test_appendix_a_matches_a_fresh_recording(tmp_endpoint, host_factory):
    host_factory([tmp_endpoint], vram=appendix_a.VRAM)
    fresh = appendix_a.generate(tmp_endpoint)
    committed = appendix_a.appendix_in_spec()
    diff = "".join(difflib.unified_diff(committed.splitlines(True), fresh.splitlines(True),
                                        "spec/pvgpu.md Appendix A", "a fresh recording"))
    assert fresh == committed, ("Appendix A differs from a fresh recording; regenerate it with "
                                f"`python tests/appendix_a.py --write` and read the diff:\n{diff}")


def test_the_appendix_holds_what_the_normative_text_requires():
    text = appendix_a.appendix_in_spec()
    from pvgpu.spec import wire
    assert f"({wire.DEVICE_FEATURES:#x})" in text  # DEV-FEAT-1: what the device offers
    assert "peers: [" in text  # CTL-HELLO-9
    assert 'name: "/proc/<n>/fd/<n>"' in text  # CTL-MEMTABLE-3: a sealed memfd, not a POSIX name
