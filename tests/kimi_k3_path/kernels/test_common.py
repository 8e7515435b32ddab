"""kernels/common.py on the CPU: the kernels' E2M1 byte layout and the PTX that decodes it, run by a small interpreter
of the PTX text itself (the GPU tests check the kernels built on it against the fp32 reference)."""
from __future__ import annotations

import re

import pytest
import torch

from kimi_k3_path.kernels.common import _FP4X8_TO_F16X2_PTX, kernel_fp4_bytes, tree_sum
from kimi_k3_path.reference import e2m1_table

MASK32 = 0xFFFFFFFF


def e4m3_value(byte: int) -> float:
    """An FP8 E4M3 byte's value (bias 7, subnormals below exponent field 1); the decode never makes its NaN."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return sign * mantissa / 8 * 2.0 ** -6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def run_decode_ptx(word: int) -> list[tuple[float, float]]:
    """_FP4X8_TO_F16X2_PTX applied to `word`: p0..p3 as (low half, high half) values. Only the instructions the
    decode uses are known; anything else fails the test."""
    regs: dict[str, int] = {"{$r0}": word}

    def value(operand: str) -> int:
        return int(operand, 16) if operand.startswith("0x") else int(operand) if operand.isdigit() else regs[operand]

    for line in _FP4X8_TO_F16X2_PTX.splitlines():
        op, _, args = line.rstrip(";").partition(" ")
        if op == ".reg":
            continue
        if op == "mov.b32":  # {a0, a1}, lo: the low 16 bits to the first
            halves, src = re.fullmatch(r"\{(\w+), (\w+)\}, (\w+)", args).group(1, 2), regs[args.rsplit(" ", 1)[1]]
            regs[halves[0]], regs[halves[1]] = src & 0xFFFF, src >> 16
            continue
        dst, *srcs = [a.strip() for a in args.split(",")]
        a = value(srcs[0])
        if op == "cvt.rn.f16x2.e4m3x2":  # the low byte to the low half
            regs[dst] = (e4m3_value(a & 0xFF), e4m3_value(a >> 8))
        elif op == "and.b32":
            regs[dst] = a & value(srcs[1])
        elif op == "or.b32":
            regs[dst] = a | value(srcs[1])
        elif op == "shl.b32":
            regs[dst] = (a << value(srcs[1])) & MASK32
        elif op == "shr.b32":
            regs[dst] = a >> value(srcs[1])
        else:
            raise AssertionError(f"the decode's PTX has an instruction this interpreter does not know: {line!r}")
    return [regs[p] for p in ("p0", "p1", "p2", "p3")]


def test_kernel_fp4_bytes_is_a_permutation_and_the_same_on_ints_and_tensors():
    as_ints = [kernel_fp4_bytes(b) for b in range(256)]
    assert sorted(as_ints) == list(range(256))
    as_tensor = kernel_fp4_bytes(torch.arange(256, dtype=torch.uint8))
    assert as_tensor.dtype == torch.uint8 and as_tensor.tolist() == as_ints


@pytest.mark.parametrize("position", range(4))
def test_decode_ptx_gives_every_e2m1_pair_times_2_to_the_minus_6(position, seed):
    """Every reference byte value at each byte position of a word (the other bytes random), laid out by
    kernel_fp4_bytes and decoded by the PTX: pairs (0, 2), (4, 6), (1, 3), (5, 7) of the word's 8 elements, exactly
    e2m1_table's values times 2^-6."""
    table = e2m1_table().tolist()
    others = torch.randint(0, 256, (256, 4), generator=torch.Generator().manual_seed(seed)).tolist()
    for byte in range(256):
        reference = others[byte]
        reference[position] = byte
        elements = [table[reference[i // 2] >> 4 * (i % 2) & 0xF] * 2.0 ** -6 for i in range(8)]
        word = sum(kernel_fp4_bytes(b) << 8 * i for i, b in enumerate(reference))
        pairs = run_decode_ptx(word)
        assert pairs == [(elements[0], elements[2]), (elements[4], elements[6]), (elements[1], elements[3]),
                         (elements[5], elements[7])], f"reference bytes {reference}"


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 28])
def test_tree_sum_adds_every_value_once_in_log2_levels(n):
    """Symbolic values: each appears exactly once in the sum, nested at most ceil(log2 n) deep (the chain's length)."""

    class Term:
        def __init__(self, names, depth=0):
            self.names, self.depth = names, depth

        def __add__(self, other):
            return Term(self.names + other.names, max(self.depth, other.depth) + 1)

    total = tree_sum([Term([i]) for i in range(n)])
    assert sorted(total.names) == list(range(n))
    assert total.depth == (n - 1).bit_length()
