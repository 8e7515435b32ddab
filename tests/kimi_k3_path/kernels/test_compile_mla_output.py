"""CPU checks of kernels/mla_output.py (the combine, W_UV and the output gate in one launch): it compiles for sm_90a
at the TP8 and TP16 head counts (and for Blackwell), with no local memory, lets the next launch in before it waits
and loads only its W_UV slice before the wait; the split launch compiles alone (mla_attention's
split_only); the host side refuses what the kernel does not take. Runs in CI without a GPU."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

import cutlass.cute as cute  # noqa: E402
from cutlass import BFloat16, Float32  # noqa: E402

from kimi_k3_path.kernels.mla_attention import MlaSplitKv, MlaWorkspace, fake_args  # noqa: E402
from kimi_k3_path.kernels.mla_output import DIMS_PER_GROUP, MlaOutput, mla_output, smem_bytes  # noqa: E402
from kimi_k3_path.kernels.runtime import dyn, fake, fake_stream  # noqa: E402

from test_compile import _cubin_dump, cubins_for  # noqa: E402

GATE_START = 1536 + 512 + 64


def args(heads: int) -> tuple:
    m = dyn()
    return (fake(Float32, (dyn(),)), fake(Float32, (dyn(),)), fake(BFloat16, (heads, 512, 128)),
            fake(BFloat16, (m, GATE_START + heads * 128)), fake(BFloat16, (m, heads * 128)), fake_stream())


@pytest.mark.parametrize("heads", [12, 6])
def test_compiles_without_local_memory_and_only_w_uv_loads_before_the_wait(heads, tmp_path):
    op = MlaOutput(heads, GATE_START)
    usage = _cubin_dump(op, args(heads), tmp_path / "res", "-res-usage")
    ((reg, stack, local),) = re.findall(r"Function \S+:\s+REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    # 3 CTAs of 256 threads an SM at up to 85 registers: W_UV's 16 words held across the wait, 4 splits in flight
    assert stack == "0" and local == "0" and int(reg) <= 85, (reg, stack, local)
    lines = _cubin_dump(op, args(heads), tmp_path / "sass", "-sass").splitlines()
    let_in = [n for n, line in enumerate(lines) if "PREEXIT" in line]
    wait = [n for n, line in enumerate(lines) if "ACQBULK" in line]
    loads = [n for n, line in enumerate(lines) if "LDG" in line]
    assert len(let_in) == 1 and len(wait) == 1 and let_in[0] < wait[0]
    # Before the wait: W_UV's DIMS_PER_GROUP 16-byte loads only (the partials and the gate are the launches' before)
    early = [lines[n] for n in loads if n < wait[0]]
    assert len(early) == DIMS_PER_GROUP and all(".128 " in line for line in early), early
    assert smem_bytes() <= 48 * 1024  # 4 CTAs an SM beside nothing, 1 beside a split CTA (171 KB)


def test_compiles_for_blackwell(tmp_path):
    for arch in ("sm_100a", "sm_103a"):
        (cubin,) = cubins_for(arch, MlaOutput(12, GATE_START), args(12), tmp_path / arch)
        assert cubin.endswith(f".{arch}.cubin")


@pytest.mark.parametrize("heads", [12, 6])
def test_the_split_launch_compiles_alone(heads, tmp_path):
    op = MlaSplitKv(heads, 0.07)
    assert callable(cute.compile(op.split_only, *fake_args(heads, combine=False)))
    names = re.findall(r"Function (\S+):", _cubin_dump(op.split_only, fake_args(heads, combine=False),
                                                      tmp_path / "res", "-res-usage"))
    assert [name.split("_kimi")[0] for name in names] == ["kernel_cutlass_split_kernel"]


def _host_args(m=2, heads=12, splits=3, **override):
    ws = MlaWorkspace(torch.zeros(m, splits, heads, 512), torch.zeros(m, splits, heads, 2))
    base = dict(workspace=ws, w_uv=torch.zeros(heads, 512, 128, dtype=torch.bfloat16),
                projected=torch.zeros(m, GATE_START + heads * 128, dtype=torch.bfloat16), gate_start=GATE_START,
                out=torch.zeros(m, heads * 128, dtype=torch.bfloat16), stream=None)
    return {**base, **override}


@pytest.mark.parametrize(("override", "message"), [
    (dict(w_uv=torch.zeros(12, 512, 64, dtype=torch.bfloat16)), r"w_uv: expected shape \(12, 512, 128\)"),
    (dict(w_uv=torch.zeros(12, 512, 128)), "w_uv: expected dtype bfloat16"),
    (dict(out=torch.zeros(2, 12 * 128)), "out: expected dtype bfloat16"),
    (dict(out=torch.zeros(3, 12 * 128, dtype=torch.bfloat16)), r"out: expected shape \(2, 1536\)"),
    (dict(projected=torch.zeros(2, GATE_START + 100, dtype=torch.bfloat16)), "has no 1536 gate columns"),
    (dict(gate_start=GATE_START + 4, projected=torch.zeros(2, GATE_START + 4 + 1536, dtype=torch.bfloat16)),
     "multiple of 8"),
    (dict(workspace=MlaWorkspace(torch.zeros(2, 3, 12, 512), torch.zeros(2, 3, 12, 3))),
     r"workspace.part_ml: expected shape \(2, 3, 12, 2\)"),
])
def test_the_host_side_refuses_what_the_kernel_does_not_take(override, message):
    with pytest.raises(ValueError, match=message):
        mla_output(**_host_args(**override))


def test_the_host_side_wants_cuda_tensors():
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        mla_output(**_host_args())
    with pytest.raises(ValueError, match="heads=17"):
        mla_output(**_host_args(heads=17))
