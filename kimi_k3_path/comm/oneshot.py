"""The one-shot all-reduce of one decode layer's M x hidden bf16 partial sums over NVLink peer-to-peer memory.

Every TP rank ends its attention and its MoE with a partial sum `x_r` [M, hidden] (bf16); every rank needs
`sum_r x_r`. Here each rank pushes its partial into a slot of every rank's buffer, raises a flag there, waits for
the world's flags in its own buffer, and sums the slots locally. One hop (a remote store and a flag), against the
2(W-1) dependent steps of a ring (`cost.py`).

**Buffer.** Every rank allocates the same `Layout` (a symmetric buffer; peers map it through CUDA IPC) and the
kernel gets the W base addresses as an int64 array. Per rank, in bytes from the base:

- data `[parity 2][src W][max_m][hidden]` bf16: slot (p, s) holds rank s's partial of a call of parity p;
- flags `[parity 2][src W][chunk C]` u32: flag (p, s, c) holds the epoch of rank s's last call of parity p whose
  chunk c it has written here;
- counts `[chunk C]` u32, local only: how many calls chunk c of this rank has completed.

A chunk is a fixed range of `hidden / C` columns over all rows (one CTA of the kernel): chunks never share bytes
whatever M is, so they synchronize independently, and M may change from call to call.

**Program** (`rank_program`: rank r, chunk c, count k read from counts[c]; epoch e = k + 1 mod 2^32, parity
p = e mod 2):

1. store x_r[:M, chunk c] into slot (p, r) of every rank's buffer (its own included);
2. release flag (p, r, c) := e in every rank's buffer (a release: the stores of 1 are visible before it);
3. acquire: wait until flag (p, s, c) == e in its own buffer, for every s;
4. out[:M, chunk c] = bf16(sum of its own slots (p, 0), ..., (p, W-1)) (`reference_sum`: fp32, rank order);
5. counts[c] := e.

**Why two parities suffice.** A rank enters call n+1 on chunk c only after it saw every peer's flag of call n on
c, and a peer raises that flag only after it finished call n-1 on c (its step 4 and 5 come first in program order,
or in stream order across launches). So no rank is more than one call ahead of any peer: call n+1 writes parity
p(n+1), which no peer is still reading (they are in call n at the earliest, parity p(n)), and the slots of parity
p(n+1) it overwrites belong to call n-1, which every peer finished. With one parity, call n+1 would overwrite slots a
slow peer is still summing for call n; with a flag that carries no epoch, a stale flag of call n would admit call
n+1 before its data arrived (`simulate.py` runs both variants and its checker catches them).

**Epochs wrap.** Flags compare for equality, and the last value in flag (p, s, c) before call n is the epoch of
call n-2 (or 0 before the first two calls, whose epochs are 1 and 2): it never equals e, also across the 2^32 wrap.
The counter lives in device memory, so a launch carries no host state (a CUDA graph can replay it).

**Rounding** (`reference_sum`): every rank adds the W bf16 partials in fp32, in rank order 0..W-1 starting from
rank 0's value (acc = x_0; acc = acc + x_s, round-to-nearest-even), and rounds once to bf16 (round-to-nearest-even):
bit-identical outputs on every rank, whatever order the data arrived in.

Pure: numpy only, no torch, no cutlass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HIDDEN = 7168  # Kimi K3's hidden size: what every TP rank all-reduces, twice per layer
BF16_BYTES = 2
FLAG_BYTES = 4
VEC_ELEMS = 8  # one 16-byte vector store of bf16
ALIGN = 128  # each region starts on its own cache line
WORLDS = (2, 4, 8)  # TP worlds within one NVLink domain (an 8-GPU H200 node); TP16 spans two nodes
PARITIES = 2
EPOCH_MOD = 1 << 32


class ProtocolError(ValueError):
    """An argument the protocol cannot serve; the message names it and what is allowed."""


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Layout:
    """The symmetric buffer of every rank for `world` ranks, calls of up to `max_m` rows of `hidden` bf16 values,
    split into `chunks` column ranges that synchronize independently (one CTA each)."""

    world: int
    max_m: int
    hidden: int = HIDDEN
    chunks: int = 16

    def __post_init__(self):
        if self.world not in WORLDS:
            raise ProtocolError(f"world={self.world}: the one-shot all-reduce runs within one NVLink domain "
                                f"(supported: {', '.join(map(str, WORLDS))})")
        if self.max_m < 1:
            raise ProtocolError(f"max_m={self.max_m} must be >= 1")
        if self.chunks < 1 or self.hidden % (self.chunks * VEC_ELEMS):
            raise ProtocolError(f"hidden={self.hidden} must split into chunks={self.chunks} column ranges of whole "
                                f"16-byte vectors ({VEC_ELEMS} bf16)")

    @property
    def chunk_cols(self) -> int:
        return self.hidden // self.chunks

    @property
    def slot_bytes(self) -> int:
        return self.max_m * self.hidden * BF16_BYTES

    @property
    def data_bytes(self) -> int:
        return PARITIES * self.world * self.slot_bytes

    @property
    def flags_offset(self) -> int:
        return _align(self.data_bytes)

    @property
    def counts_offset(self) -> int:
        return self.flags_offset + _align(PARITIES * self.world * self.chunks * FLAG_BYTES)

    @property
    def nbytes(self) -> int:
        """Bytes of one rank's buffer: 2 W max_m hidden bf16 values, then the flags and the counts."""
        return self.counts_offset + _align(self.chunks * FLAG_BYTES)

    def slot_offset(self, parity: int, src: int) -> int:
        return (parity * self.world + src) * self.slot_bytes

    def flag_index(self, parity: int, src: int, chunk: int) -> int:
        """Index of flag (parity, src, chunk) among the u32 words at flags_offset."""
        return (parity * self.world + src) * self.chunks + chunk

    def flag_offset(self, parity: int, src: int, chunk: int) -> int:
        return self.flags_offset + self.flag_index(parity, src, chunk) * FLAG_BYTES

    def count_offset(self, chunk: int) -> int:
        return self.counts_offset + chunk * FLAG_BYTES

    def check_call(self, m: int, rank: int | None = None) -> None:
        """Raise ProtocolError unless a call of m rows (by `rank`) fits this buffer."""
        if not 1 <= m <= self.max_m:
            raise ProtocolError(f"M={m} rows: the buffer holds 1..{self.max_m} (allocate it for the largest batch)")
        if rank is not None and not 0 <= rank < self.world:
            raise ProtocolError(f"rank={rank} is not in 0..{self.world - 1}")


def buffer_bytes(world: int, max_m: int, hidden: int = HIDDEN, chunks: int = 16) -> int:
    """Bytes of each rank's symmetric buffer (e.g. 14.7 MB at world 8, max_m 64, hidden 7168)."""
    return Layout(world, max_m, hidden, chunks).nbytes


def epoch_of(count: int) -> int:
    """The epoch of the call that follows `count` completed calls: never 0 before the counter wraps."""
    return (count + 1) % EPOCH_MOD


def parity_of(epoch: int) -> int:
    return epoch % PARITIES


# The program's operations, one per step a scheduler may interleave with the other ranks'. `rows` is a half-open
# row range of the call's M rows; every operation is on chunk `chunk` only.

@dataclass(frozen=True)
class Put:
    """Store x_rank[rows, chunk] into slot (parity, rank) of rank dst's buffer (step 1)."""
    dst: int
    parity: int
    rows: tuple[int, int]


@dataclass(frozen=True)
class Release:
    """Flag (parity, rank, chunk) of rank dst's buffer := value, after every Put before it (step 2)."""
    dst: int
    index: int
    value: int


@dataclass(frozen=True)
class Acquire:
    """Wait until flag `index` of this rank's own buffer == value (step 3)."""
    index: int
    value: int


@dataclass(frozen=True)
class Sum:
    """out[rows, chunk] = reference_sum of this rank's own slots (parity, 0..W-1) (step 4)."""
    parity: int
    rows: tuple[int, int]


@dataclass(frozen=True)
class Count:
    """counts[chunk] := value in this rank's own buffer (step 5)."""
    value: int


def row_pieces(m: int, pieces: int) -> list[tuple[int, int]]:
    """[0, m) cut into at most `pieces` non-empty row ranges."""
    cuts = sorted({m * i // pieces for i in range(pieces + 1)})
    return list(zip(cuts[:-1], cuts[1:]))


def rank_program(layout: Layout, rank: int, chunk: int, count: int, m: int, *, pieces: int = 1,
                 single_buffer: bool = False, epochless: bool = False) -> list:
    """The operations of chunk `chunk` of `rank` in the call after `count` completed ones, in program order.
    pieces: how many row ranges each Put and Sum is cut into (finer interleavings for the simulator; the kernel
    issues one 16-byte vector at a time). single_buffer / epochless: the broken variants the simulator must catch
    (one data parity; a flag that says "written" instead of which call)."""
    layout.check_call(m, rank)
    epoch = epoch_of(count)
    parity = 0 if single_buffer else parity_of(epoch)
    flag = 1 if epochless else epoch
    # Rank r starts at peer r + 1, so that the ranks' first stores go to different peers.
    peers = [(rank + 1 + k) % layout.world for k in range(layout.world)]
    rows = row_pieces(m, pieces)
    ops: list = [Put(dst, parity, r) for dst in peers for r in rows]
    ops += [Release(dst, layout.flag_index(parity, rank, chunk), flag) for dst in peers]
    ops += [Acquire(layout.flag_index(parity, src, chunk), flag) for src in range(layout.world)]
    ops += [Sum(parity, r) for r in rows]
    ops.append(Count(epoch))
    return ops


# --- numerics: bf16 as uint16 bit patterns ------------------------------------------------------------------------

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) as fp32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """fp32 values rounded to bf16 (round-to-nearest-even, as cvt.rn.bf16x2.f32), as uint16 bit patterns; NaN stays
    a quiet NaN."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    return np.where(nan, ((u >> 16) | np.uint32(0x40)).astype(np.uint16), rounded)


def reference_sum(partials: np.ndarray) -> np.ndarray:
    """What every rank's all-reduce returns for `partials` [W, ...] (bf16 bit patterns): fp32 accumulation in rank
    order starting from rank 0's value, one round-to-nearest-even to bf16."""
    acc = bf16_to_f32(partials[0]).copy()
    for s in range(1, partials.shape[0]):
        acc += bf16_to_f32(partials[s])
    return f32_to_bf16(acc)
