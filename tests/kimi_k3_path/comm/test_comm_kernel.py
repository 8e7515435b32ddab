"""The one-shot all-reduce kernel compiles for sm_90a on the CPU (fake tensors, dynamic M) at every world, in service
form (one rank per launch) and loop-back form (the world in one launch), and its PTX carries the protocol: a vector
store per rank, system-scope release and acquire for the flags, W - 1 unfused adds per value, one bf16 rounding."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

import cutlass.cute as cute  # noqa: E402

from kimi_k3_path.comm.kernel import OneShotAllReduce, fake_args  # noqa: E402
from kimi_k3_path.comm.oneshot import Layout  # noqa: E402


def _ptx(layout: Layout, ranks: int, dump_dir) -> str:
    fn = cute.compile(OneShotAllReduce(layout, ranks), *fake_args(layout, ranks),
                      options=f"--keep-ptx --dump-dir={dump_dir}")  # without a dump dir, the PTX lands in the cwd
    return fn.__ptx__


@pytest.mark.parametrize("world, ranks", [(2, 1), (4, 1), (8, 1), (8, 8)])
def test_compiles_with_the_protocol_in_its_ptx(world, ranks, tmp_path):
    ptx = _ptx(Layout(world, max_m=64), ranks, tmp_path)
    assert ".target sm_90a" in ptx
    assert ptx.count("st.global.v4.b32") == world + 1  # slot (p, rank) of every buffer, then out
    assert ptx.count("st.release.sys.global.b32") == 1 and ptx.count("ld.acquire.sys.global.b32") >= 1
    assert ptx.count("ld.global.cg.v4.b32") == world
    assert ptx.count("add.rn.f32") == 8 * (world - 1) and ptx.count("cvt.rn.bf16x2.f32") == 4
    assert "fma" not in ptx  # nothing contracted: the rank-order fp32 sum is the contract


def test_a_loop_back_launch_must_fit_co_resident():
    with pytest.raises(ValueError, match="8 ranks x 32 chunks = 256 CTAs: more than the 132 SMs"):
        OneShotAllReduce(Layout(8, max_m=64, chunks=32), 8)
    with pytest.raises(ValueError, match="ranks_per_launch=2"):
        OneShotAllReduce(Layout(8, max_m=64), 2)


def test_the_host_rejects_what_the_buffer_cannot_serve():
    torch = pytest.importorskip("torch")
    from kimi_k3_path.comm.kernel import oneshot_all_reduce
    from kimi_k3_path.comm.oneshot import ProtocolError

    layout = Layout(2, max_m=4, hidden=128, chunks=2)
    x = torch.zeros(1, 5, 128, dtype=torch.bfloat16)
    with pytest.raises(ProtocolError, match="M=5 rows: the buffer holds 1..4"):
        oneshot_all_reduce(layout, torch.zeros(1, 2, dtype=torch.int64), x, x, 0, None)
    with pytest.raises(ProtocolError, match="rank=2 is not in 0..1"):
        oneshot_all_reduce(layout, torch.zeros(1, 2, dtype=torch.int64), x[:, :4], x[:, :4], 2, None)
    with pytest.raises(ValueError, match="ptrs: must be a CUDA tensor"):
        oneshot_all_reduce(layout, torch.zeros(1, 2, dtype=torch.int64), x[:, :4], x[:, :4], 1, None)
