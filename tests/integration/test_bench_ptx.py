"""bench/ptx.py (`pvgpu bench ptx`): its kernels load from the committed PTX and compute
what numpy computes, through a real host (small sizes; the benchmark times large ones)."""

from pvgpu import guest
from pvgpu.bench import ptx


def test_the_end_to_end_figures_come_from_correct_results(shared_host):
    lines = []
    with guest.connect(shared_host.endpoint, mem_size=64 << 20) as conn:
        res = ptx.end_to_end(conn, n=1 << 14, gemm_n=32, small_launches=5, out=lines.append)
    assert set(res) == {"vector_add", "saxpy", "sgemm", "reduce", "small"}
    for name in ("vector_add", "saxpy", "reduce"):
        assert res[name]["n"] == 1 << 14 and res[name]["ptx_vs_numpy"] > 0
    assert res["sgemm"]["ptx_gflops"] > 0 and len(lines) == 5
    small = res["small"]
    assert small["launches"] == 5 and small["n"] == ptx.SMALL
    assert small["ptx_vs_builtin_async"] == small["ptx_per_s"] / small["builtin_per_s"]
    assert small["ptx_sync_s"] > 0 and small["builtin_sync_s"] > 0


def test_the_kernels_ship_with_the_package():
    assert ptx.KERNELS.is_file() and ptx.KERNELS.with_suffix(".cu").is_file()
    text = ptx.KERNELS.read_text()
    for entry in ("vector_add", "saxpy", "sgemm_tiled", "reduce_shfl"):
        assert f".entry {entry}(" in text
