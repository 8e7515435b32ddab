"""Bytes and hops of one all-reduce of M x hidden bf16 per rank: the one-shot push (`oneshot.py`) against a ring.

A decode layer all-reduces twice (after its attention and after its MoE); each call's payload per rank is
P = M x 7168 x 2 bytes.

- **One-shot**: each rank stores its whole partial into the W - 1 peers' buffers, (W - 1) P bytes sent over NVLink
  (plus a 4-byte flag per peer and chunk), and sums W slots from its own HBM: 1 hop on the critical path (a remote
  store, then the flag it releases).
- **Ring** (what NCCL's ring does; its tree and its LL protocols change the constants, not the picture): a
  reduce-scatter then an all-gather, 2 (W - 1) steps of P / W bytes each: 2 (W - 1) / W P bytes sent, 2 (W - 1)
  dependent hops.

**M = 1 is latency-bound.** P = 14,336 bytes (14 KB). At W = 8 the one-shot sends 7 P = 100 KB per rank, four
times the ring's 1.75 P = 25 KB, but at the H200's nominal 450 GB/s of NVLink per direction either is a fraction
of a microsecond of wire time, less than one hop's synchronization (a remote store becoming visible and a flag
being seen). What decides the time is the number of dependent hops: 1 against 14. The ring's fewer bytes win only
from the M where (W - 1)(1 - 2/W) P / bandwidth exceeds (2W - 3) hops' latency (`crossover_m`); the hop latency
and bandwidth are parameters here, to be measured (benchmarks/kimi_k3/bench_comm.py), not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from .oneshot import BF16_BYTES, FLAG_BYTES, HIDDEN, WORLDS, ProtocolError


@dataclass(frozen=True)
class Traffic:
    """One all-reduce call as seen by one rank."""

    algorithm: str
    world: int
    m: int
    payload: int  # bytes of this rank's partial, M x hidden x 2
    sent: int  # bytes this rank sends over NVLink (it receives as many)
    hops: int  # dependent link crossings on the critical path
    local_read: int  # bytes this rank's kernel reads from its own HBM (0: not modeled)


def _payload(world: int, m: int, hidden: int) -> int:
    if world not in WORLDS:
        raise ProtocolError(f"world={world} (supported: {', '.join(map(str, WORLDS))})")
    if m < 1:
        raise ProtocolError(f"M={m} must be >= 1")
    return m * hidden * BF16_BYTES


def oneshot(world: int, m: int, hidden: int = HIDDEN, chunks: int = 16) -> Traffic:
    p = _payload(world, m, hidden)
    sent = (world - 1) * (p + chunks * FLAG_BYTES)
    # Its own input once, then the W slots of its buffer.
    return Traffic("oneshot", world, m, p, sent, hops=1, local_read=(world + 1) * p)


def ring(world: int, m: int, hidden: int = HIDDEN) -> Traffic:
    p = _payload(world, m, hidden)
    steps = 2 * (world - 1)
    return Traffic("ring", world, m, p, steps * -(-p // world), hops=steps, local_read=0)


def latency_s(t: Traffic, hop_s: float, link_bytes_per_s: float) -> float:
    """The model's time of one call: its hops' latency plus its bytes at the link's bandwidth (one direction)."""
    return t.hops * hop_s + t.sent / link_bytes_per_s


def crossover_m(world: int, hop_s: float, link_bytes_per_s: float, hidden: int = HIDDEN,
                max_m: int = 4096) -> int | None:
    """The smallest M at which the ring's model time is below the one-shot's, or None up to max_m."""
    for m in range(1, max_m + 1):
        if latency_s(ring(world, m, hidden), hop_s, link_bytes_per_s) < latency_s(
                oneshot(world, m, hidden), hop_s, link_bytes_per_s):
            return m
    return None
