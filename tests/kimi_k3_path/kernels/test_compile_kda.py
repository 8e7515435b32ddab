"""CPU checks of the KDA recurrent step kernel (kernels/kda_recurrent.py): it compiles
for sm_90a with fake tensors (dynamic batch and state pool) at the TP8 and TP16 per-rank shapes in both CTA forms
(8 and 16 warps), its SASS keeps the state in registers with every load that in_proj does not write issued before
the wait and the barrier, and the host side rejects what the kernel does not support. Runs in CI without a GPU."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

import cutlass.cute as cute  # noqa: E402

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.kernels.kda_recurrent import (  # noqa: E402
    WARP_FORMS,
    KdaKernelWeights,
    KdaRecurrent,
    check_slot_indices,
    fake_args,
    floor_us,
    kda_recurrent_bytes,
    aligned_columns,
    kda_recurrent_decode,
    projected_columns,
)
from kimi_k3_path.kernels.kda import padded_rows  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402

from test_compile import SM_REGISTERS, _cubin_dump, cubins_for  # noqa: E402


def kda_dims(tp: int):
    return layer_dims(named_config("kimi_k3"), tp).kda


def op_for(d, warps: int = 8) -> KdaRecurrent:
    return KdaRecurrent(d.heads, d.head_dim, d.conv_width, d.gate_lower_bound, d.norm_eps, warps)


@pytest.mark.parametrize("warps", WARP_FORMS)
@pytest.mark.parametrize("tp, heads", [(8, 12), (16, 6)])
def test_kda_recurrent_compiles_for_the_h200(tp, heads, warps):
    assert os.environ.get("CUTE_DSL_ARCH") == "sm_90a"
    d = kda_dims(tp)
    assert d.heads == heads and d.head_dim == 128 and d.conv_width == 4
    assert callable(cute.compile(op_for(d, warps), *fake_args(d.heads)))
    # as kda.py calls it: in_proj's output padded to the tensor-core tile (6288 / 3216 columns)
    assert callable(cute.compile(op_for(d, warps), *fake_args(d.heads, columns=padded_rows(d.in_proj_rows))))


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
def test_kda_recurrent_compiles_for_blackwell(arch, tmp_path):
    """As every kernel (test_compile.test_every_form_compiles_for_blackwell): a port starts from code that builds."""
    for tp in (8, 16):
        d = kda_dims(tp)
        for warps in WARP_FORMS:
            (cubin,) = cubins_for(arch, op_for(d, warps), fake_args(d.heads), tmp_path / f"tp{tp}-{warps}")
            assert cubin.endswith(f".{arch}.cubin")


@pytest.mark.parametrize("warps", WARP_FORMS)
@pytest.mark.parametrize("tp", [8, 16])
def test_state_stays_in_registers_and_streams_once(tp, warps, tmp_path):
    """What the design assumes: the rows x 16 bytes a thread holds (16 at 8 warps, 8 at 16) never spill (no local
    memory) and leave 2 CTAs of 8 warps or 1 of 16 per SM (<= 128 registers); the state loads and the
    conv taps (weak, L1::no_allocate: LDG.E.NA.128) and the gate warps' cp.async copies of their f_b rows (LDGSTS:
    16 vectors per channel) are all issued before griddepcontrol.wait (ACQBULK) and the CTA barrier, each row is
    stored once, and no global load comes after the last barrier."""
    d = kda_dims(tp)
    op = op_for(d, warps)
    usage = _cubin_dump(op, fake_args(d.heads), tmp_path / "res", "-res-usage")
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    assert "LOCAL:0" in usage and "STACK:0" in usage, usage
    assert registers * 16 * 32 <= SM_REGISTERS, f"{registers} registers per thread"  # 16 warps per SM either way
    sass = _cubin_dump(op, fake_args(d.heads), tmp_path / "sass", "-sass").splitlines()
    loads = [n for n, line in enumerate(sass) if "LDG.E.NA.128" in line]
    barrier = next(n for n, line in enumerate(sass) if "BAR.SYNC" in line)
    # One wait per branch of the warps' first phase (conv, gate, idle) before the barrier; a skipped slot's after it.
    waits = [n for n, line in enumerate(sass[:barrier]) if "ACQBULK" in line]
    assert len(waits) == 3

    def issued_before_a_wait(group: list[int]) -> bool:  # no wait inside the group, one after it before the barrier
        return not any(min(group) < w < max(group) for w in waits) and max(group) < max(waits)

    assert len(loads) == op.rows + 2 and issued_before_a_wait(loads)
    copies = [n for n, line in enumerate(sass) if "LDGSTS" in line]
    assert len(copies) == op.gate_vecs and issued_before_a_wait(copies)  # the thread's share of its channel's row
    assert sum("STG.E.128" in line for line in sass) == op.rows
    # in_proj's output gate and beta are loaded before the barriers: after the last one a load would be one more L2
    # round trip before the output store
    last_barrier = max(n for n, line in enumerate(sass) if "BAR.SYNC" in line)
    assert not [line for line in sass[last_barrier:] if "LDG" in line]


def test_bytes_and_floors_per_row():
    """The byte counts the design document and the module docstring state (floor at 4.3 TB/s)."""
    state_row = 128 * 128 * 4
    for heads, m, mb, us, state_share in [(12, 1, 2.081, 0.484, 0.756), (12, 64, 105.640, 24.567, 0.953),
                                          (6, 1, 1.041, 0.242, 0.756), (6, 64, 52.829, 12.286, 0.953)]:
        parts = kda_recurrent_bytes(m, heads)
        total = sum(parts.values())
        assert parts["recurrent_state"] == 2 * m * heads * state_row
        assert parts["weights"] > heads * 128 * 128 * 2  # f_b's rows, read once from DRAM
        assert round(total / 1e6, 3) == mb and round(floor_us(total), 3) == us
        assert round(parts["recurrent_state"] / total, 3) == state_share


def test_unsupported_dims_are_rejected():
    with pytest.raises(ValueError, match="head_dim=64"):
        KdaRecurrent(12, 64, 4, -5.0, 1e-5)
    with pytest.raises(ValueError, match="conv_width=3"):
        KdaRecurrent(12, 128, 3, -5.0, 1e-5)
    with pytest.raises(ValueError, match="heads=0"):
        KdaRecurrent(0, 128, 4, -5.0, 1e-5)
    with pytest.raises(ValueError, match="gate_lower_bound"):
        KdaRecurrent(12, 128, 4, 0.0, 1e-5)
    with pytest.raises(ValueError, match="warps=4"):
        KdaRecurrent(12, 128, 4, -5.0, 1e-5, 4)
    import test_kda_recurrent_gpu  # its parametrization names the forms without importing CuTe DSL

    assert test_kda_recurrent_gpu.WARP_FORMS == WARP_FORMS
    for warps in WARP_FORMS:  # a warp's S k and S q sums fill one reduce-scatter over its lanes
        op = KdaRecurrent(12, 128, 4, -5.0, 1e-5, warps)
        assert op.warps * op.rows == 128 and 2 * op.rows <= 32 and op.per_channel * op.gate_vecs == 16


def test_slots_out_of_range_or_shared_are_rejected():
    check_slot_indices([3, 0, 7, 1], 8)
    with pytest.raises(ValueError, match=r"\[-1, 8\] are outside the pool \[0, 8\)"):
        check_slot_indices([-1, 2, 8], 8)
    with pytest.raises(ValueError, match=r"\[2\] are used by more than one sequence"):
        check_slot_indices([2, 5, 2, 2], 8)


def _cpu_args(m=3, heads=6, pool=5, d=128, **override):
    proj = heads * d
    bf16, f32 = torch.bfloat16, torch.float32
    args = dict(
        projected=torch.zeros(m, aligned_columns(heads, d), dtype=bf16),
        w=KdaKernelWeights(f_b=torch.zeros(proj, d, dtype=bf16), conv=torch.zeros(3 * proj, 4, dtype=bf16),
                           a_log=torch.zeros(heads, dtype=f32),
                           dt_bias=torch.zeros(proj, dtype=f32), o_norm=torch.zeros(d, dtype=f32),
                           gate_lower_bound=-5.0, norm_eps=1e-5),
        slots=torch.arange(m, dtype=torch.int32), conv_state=torch.zeros(pool, 3 * proj, 3, dtype=bf16),
        state=torch.zeros(pool, heads, d, d, dtype=f32), out=torch.zeros(m, proj, dtype=bf16), stream=None,
    )
    if "f_b" in override:  # a weight of the middle: it travels in w
        args["w"] = dataclasses.replace(args["w"], f_b=override.pop("f_b"))
    args.update(override)
    return args


@pytest.mark.parametrize("override, message", [
    (dict(f_b=torch.zeros(768, 128)), "f_b: expected dtype bfloat16"),
    (dict(state=torch.zeros(5, 6, 128, 128, dtype=torch.bfloat16)), "state: expected dtype float32"),
    (dict(conv_state=torch.zeros(4, 3 * 768, 3, dtype=torch.bfloat16)), r"conv_state: expected shape \(5, 2304, 3\)"),
    (dict(slots=torch.arange(3, dtype=torch.int64)), "slots: expected dtype int32"),
    (dict(out=torch.zeros(2, 768, dtype=torch.bfloat16)), r"out: expected shape \(3, 768\)"),
    (dict(projected=torch.zeros(3, 4 * 768, dtype=torch.bfloat16)), r"projected: expected shape \(3, 3208\)"),
    (dict(projected=torch.zeros(3, 3210, dtype=torch.bfloat16)), "3210 columns, not a multiple of 8"),
])
def test_host_wrapper_rejects_wrong_shapes_and_dtypes(override, message):
    with pytest.raises(ValueError, match=message):
        kda_recurrent_decode(**_cpu_args(**override))


def test_host_wrapper_rejects_batches_outside_1_to_64():
    for m in (0, 65):
        with pytest.raises(ValueError, match=f"M={m} must be in 1..64"):
            kda_recurrent_decode(**_cpu_args(m=m))


def test_host_wrapper_wants_cuda_tensors():
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        kda_recurrent_decode(**_cpu_args())


def test_a_wider_projection_passes_the_shape_checks():
    """kda.py hands over in_proj's padded output whole: wider than projected_columns is fine (the first device check
    is what refuses these CPU tensors), narrower is not (above)."""
    wide = torch.zeros(3, padded_rows(projected_columns(6, 128)), dtype=torch.bfloat16)
    assert wide.shape[1] == 3216 and aligned_columns(6, 128) == 3208 and aligned_columns(12, 128) == 6288
    with pytest.raises(ValueError, match="projected: must be a CUDA tensor"):
        kda_recurrent_decode(**_cpu_args(projected=wide))
