"""The one-shot and ring all-reduce byte/hop model."""

from __future__ import annotations

import pytest

from kimi_k3_path.comm import cost
from kimi_k3_path.comm.oneshot import ProtocolError


def test_one_token_at_tp8():
    one, ring = cost.oneshot(8, 1), cost.ring(8, 1)
    assert one.payload == ring.payload == 14336  # 1 x 7168 bf16
    assert one.sent == 7 * (14336 + 16 * 4) and one.hops == 1
    assert ring.sent == 2 * 7 * 14336 // 8 and ring.hops == 14
    assert one.local_read == 9 * 14336


@pytest.mark.parametrize("world", [2, 4, 8])
def test_oneshot_sends_w_over_2_times_the_ring_data(world):
    for m in (1, 7, 64):
        one, ring = cost.oneshot(world, m, chunks=1), cost.ring(world, m)
        data = one.sent - (world - 1) * 4
        assert data * 2 == ring.sent * world


def test_latency_and_crossover():
    one = cost.oneshot(8, 1)
    assert cost.latency_s(one, 1e-6, 1e9) == pytest.approx(1e-6 + one.sent / 1e9)
    # Equal hop latency and bandwidth: the crossover moves to larger M as hops get dearer, and at W=2 the ring
    # sends the one-shot's bytes in twice the hops, so it never wins.
    slow, fast = cost.crossover_m(8, 2e-6, 450e9), cost.crossover_m(8, 0.5e-6, 450e9)
    assert fast is not None and slow is not None and 1 < fast < slow
    assert cost.crossover_m(2, 0.5e-6, 450e9) is None


def test_rejects():
    with pytest.raises(ProtocolError, match="world=16"):
        cost.ring(16, 1)
    with pytest.raises(ProtocolError, match="M=0"):
        cost.oneshot(8, 0)
