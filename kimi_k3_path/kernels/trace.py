"""Per-CTA timelines of the one-token block: when each CTA of each launch started and ended, and on which SM.

A traced launch is compiled with the address of its record buffer (an int64 [CTAs, 5] tensor: start ns, end ns, SM
id, start cycle, end cycle; -1 until written): thread 0 of every CTA reads %globaltimer and its SM's %clock64 as the
CTA starts and as thread 0 reaches the end of the kernel (common.trace_cta). Cycles over nanoseconds give the SM clock
each launch ran at: the H200 moves its clock with power, which a timeline in nanoseconds alone cannot tell from a
slower kernel. Untraced launches compile exactly as before (the address is a compile-time 0), so a trace costs
nothing unless asked for:

    trace = CtaTrace(bench_moe.block_ctas(dims, sms), "cuda")   # TP8, 132 SMs: 2240, 768, 832 and 396 CTAs
    with tracing(trace):
        steps = moe.decode_steps(...)   # the launches read the addresses when they are compiled and launched
    ... run the block ...
    summary = summarize(trace.records(), sms)

The GPU's global timer ticks in steps of ~32 ns on the H200 (the PTX manual leaves its resolution to the chip), so
single CTAs are resolved to that; the summaries are over hundreds of CTAs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from contextlib import contextmanager

RECORD_WORDS = 5  # start ns, end ns, SM id, start cycle, end cycle
RECORD_BYTES = RECORD_WORDS * 8
UNWRITTEN = -1

_active: CtaTrace | None = None


class CtaTrace:
    """One record buffer per traced launch, allocated once (graph-safe: fixed addresses)."""

    def __init__(self, ctas: dict[str, int], device) -> None:
        import torch

        bad = {name: n for name, n in ctas.items() if not isinstance(n, int) or n < 1}
        if bad:
            raise ValueError(f"CtaTrace: CTA counts must be positive integers, got {bad}")
        self.buffers = {name: torch.full((n, RECORD_WORDS), UNWRITTEN, dtype=torch.int64, device=device)
                        for name, n in ctas.items()}

    def address(self, launch: str, ctas: int) -> int:
        """The record buffer's address for `launch`, checked to hold `ctas` records (0: the launch is not traced)."""
        buf = self.buffers.get(launch)
        if buf is None:
            return 0
        if buf.shape[0] < ctas:
            raise ValueError(f"CtaTrace: launch {launch!r} has {ctas} CTAs but its buffer holds {buf.shape[0]}")
        return buf.data_ptr()

    def reset(self) -> None:
        for buf in self.buffers.values():
            buf.fill_(UNWRITTEN)

    def records(self) -> dict[str, list[tuple[int, ...]]]:
        """Each launch's (start ns, end ns, SM id, start cycle, end cycle) per CTA, in CTA order, copied to the host."""
        return {name: [tuple(r) for r in buf.cpu().tolist()] for name, buf in self.buffers.items()}


@contextmanager
def tracing(trace: CtaTrace) -> Iterator[CtaTrace]:
    """Launches compiled or launched inside the block record into `trace` (one trace active at a time)."""
    global _active
    if _active is not None:
        raise RuntimeError("tracing: a trace is already active")
    _active = trace
    try:
        yield trace
    finally:
        _active = None


def trace_address(launch: str, ctas: int) -> int:
    """The active trace's record address for `launch` (0 when nothing is traced): a compile-time constant of the
    launch, so it belongs in its compile-cache key."""
    return 0 if _active is None else _active.address(launch, ctas)


def summarize(records: dict[str, list[tuple[int, ...]]], sms: int = 132) -> dict:
    """Per launch, in us from the first CTA start of any launch: when its CTAs started and ended (first, median,
    last), how long a CTA lived (median), the SM clock over its CTAs' lives (all their cycles over all their
    nanoseconds, MHz), how many SMs it used, and at its busiest how many of its CTAs were resident on one SM. Raises
    ValueError when a record was never written or ends before it starts (a CTA that did not run its probes: nothing
    passes silently)."""
    checked = {}
    for name, rows in records.items():
        if not rows:
            raise ValueError(f"summarize: launch {name!r} has no records")
        for i, row in enumerate(rows):
            if len(row) != RECORD_WORDS or UNWRITTEN in row:
                raise ValueError(f"summarize: launch {name!r}, CTA {i}: record not written {tuple(row)}")
            start, end, sm, start_cycle, end_cycle = row
            if end < start or end_cycle < start_cycle or not 0 <= sm < sms:
                raise ValueError(f"summarize: launch {name!r}, CTA {i}: bad record {tuple(row)}")
        checked[name] = rows
    origin = min(row[0] for rows in checked.values() for row in rows)

    def us(ns: int) -> float:
        return round((ns - origin) / 1e3, 3)

    out = {}
    for name, rows in checked.items():
        starts = sorted(row[0] for row in rows)
        ends = sorted(row[1] for row in rows)
        nanoseconds = sum(row[1] - row[0] for row in rows)
        out[name] = {
            "ctas": len(rows),
            "start_us": {"first": us(starts[0]), "median": us(statistics.median_low(starts)), "last": us(starts[-1])},
            "end_us": {"first": us(ends[0]), "median": us(statistics.median_low(ends)), "last": us(ends[-1])},
            "cta_life_us": round(statistics.median(row[1] - row[0] for row in rows) / 1e3, 3),
            "sm_mhz": round(sum(row[4] - row[3] for row in rows) / nanoseconds * 1e3, 1) if nanoseconds else None,
            "sms": len({row[2] for row in rows}),
            "max_resident_per_sm": max_resident_per_sm(rows),
        }
    return out


def max_resident_per_sm(rows: list[tuple[int, ...]]) -> int:
    """The most CTAs of these records alive at once on one SM (an end at the same tick as a start frees its place
    first)."""
    events: dict[int, list[tuple[int, int]]] = {}
    for start, end, sm, *_ in rows:
        events.setdefault(sm, []).extend([(start, 1), (end, -1)])
    best = 0
    for evs in events.values():
        alive = 0
        for _, step in sorted(evs):  # (t, -1) sorts before (t, +1)
            alive += step
            best = max(best, alive)
    return best
