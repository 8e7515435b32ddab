"""The one-shot all-reduce kernel on one H200 in loop-back: W buffers on one GPU stand for W GPUs, all W rank
programs in one launch (W x 16 CTAs <= 132 SMs, so every spin-wait's peer is running), hundreds of consecutive calls
of varying M on one stream, every rank's output checked bit for bit against the CPU's reference_sum (the same checker
as the CPU simulation). On the H200 at 15bb88a the loop-back tests passed (W = 2, 4, 8; 300 calls each); the
service form on two streams did not (skipped below, with the reason)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from kimi_k3_path.comm.oneshot import Layout  # noqa: E402
from kimi_k3_path.comm.simulate import check  # noqa: E402


def _bits(t) -> np.ndarray:
    return t.cpu().view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_loop_back_calls_give_every_rank_the_rank_order_sum(world, seed):
    from kimi_k3_path.comm.kernel import oneshot_all_reduce

    layout = Layout(world, max_m=64)
    buffers = torch.zeros(world, layout.nbytes, dtype=torch.uint8, device="cuda")
    row = [buffers[q].data_ptr() for q in range(world)]
    ptrs = torch.tensor([row] * world, dtype=torch.int64, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rng = np.random.default_rng(seed)
    stream = torch.cuda.current_stream()
    inputs, outputs = [], []
    for _ in range(300):
        m = int(rng.integers(1, layout.max_m + 1))
        x = torch.randn(world, m, layout.hidden, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty_like(x)
        oneshot_all_reduce(layout, ptrs, x, out, 0, stream)
        inputs.append(x)
        outputs.append(out)
    torch.cuda.synchronize()
    check([_bits(x) for x in inputs], [_bits(o) for o in outputs])
    counts = buffers[:, layout.counts_offset:layout.counts_offset + 4 * layout.chunks].cpu().view(torch.int32)
    assert (counts == 300).all()


@pytest.mark.skip(reason="fails on the H200 (run of 2026-12-03 at 15bb88a) and the process then segfaults while pytest "
                  "formats the failure, which would end a whole GPU evidence run: cause not yet known (issue 40)")
def test_a_rank_at_a_time_on_two_streams_of_one_gpu(seed):
    """Service form (one rank per launch): rank 0 and rank 1 launched on two streams, so each launch's CTAs
    spin until the other launch's CTAs run beside them (2 x 16 CTAs fit)."""
    from kimi_k3_path.comm.kernel import oneshot_all_reduce

    layout = Layout(2, max_m=8)
    buffers = torch.zeros(2, layout.nbytes, dtype=torch.uint8, device="cuda")
    ptrs = torch.tensor([[buffers[0].data_ptr(), buffers[1].data_ptr()]], dtype=torch.int64, device="cuda")
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs, outputs = [], []
    for n in range(50):
        m = 1 + n % layout.max_m
        x = torch.randn(2, m, layout.hidden, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty_like(x)
        torch.cuda.synchronize()  # x is ready before either stream starts
        for r in range(2):
            with torch.cuda.stream(streams[r]):
                oneshot_all_reduce(layout, ptrs, x[r:r + 1], out[r:r + 1], r, streams[r])
        inputs.append(x)
        outputs.append(out)
    torch.cuda.synchronize()
    check([_bits(x) for x in inputs], [_bits(o) for o in outputs])
