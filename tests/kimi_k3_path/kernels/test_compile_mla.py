"""CPU checks of the split-KV MLA attention (kernels/mla_attention.py): both launches
compile for sm_90a with fake tensors (dynamic batch, page pool, block table width and splits) at the TP8 and TP16
per-rank head counts, and for sm_100a / sm_103a; the SASS has the planned tensor-core work and no local memory; the
byte floors and split counts the docstring and the design document state; the host side rejects what the kernel does
not support. Runs in CI without a GPU."""

from __future__ import annotations

import os
import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")


from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.kernels.mla_attention import (  # noqa: E402
    K_STEPS,
    PAGE,
    MlaSplitKv,
    MlaWorkspace,
    check_cache_inputs,
    choose_splits,
    fake_args,
    floor_us,
    mla_attention_bytes,
    mla_attention_decode,
    mla_partial_bytes,
)
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402

from test_compile import SM_SHARED_BYTES, _cubin_dump, cubins_for  # noqa: E402


def mla_dims(tp: int):
    return layer_dims(named_config("kimi_k3"), tp).mla


def op_for(tp: int) -> MlaSplitKv:
    d = mla_dims(tp)
    return MlaSplitKv(d.heads, d.scale)


@pytest.mark.parametrize("tp, heads", [(8, 12), (16, 6)])
def test_mla_attention_compiles_for_the_h200(tp, heads, tmp_path):
    """Both kernels build; the split kernel keeps everything in registers (no local memory), its tensor-core work is
    the planned one per page (score: 36 k16 steps x head tiles; PV: 8 dim tiles x 4 row steps x head tiles; one
    ldmatrix per A fragment and per Q fragment) and its pages arrive by bulk copies (UBLKCP)."""
    assert os.environ.get("CUTE_DSL_ARCH") == "sm_90a"
    d = mla_dims(tp)
    assert d.heads == heads and d.kv_lora == 512 and d.qk_rope == 64
    op = op_for(tp)
    usage = _cubin_dump(op, fake_args(heads), tmp_path / "res", "-res-usage")
    kernels = re.findall(r"Function (\S+):\s+REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
    assert sorted(name.split("_kimi")[0] for name, *_ in kernels) == ["kernel_cutlass_combine_kernel",
                                                                      "kernel_cutlass_split_kernel"]
    for name, reg, stack, local in kernels:
        assert stack == "0" and local == "0", (name, reg, stack, local)
        assert int(reg) <= 168, f"{name}: {reg} registers"  # split kernel: 128 at TP8, 71 at TP16 (CPU build)
    sass = _cubin_dump(op, fake_args(heads), tmp_path / "sass", "-sass")
    tiles = op.head_tiles
    assert sass.count("HMMA.16816.F32.BF16") == (K_STEPS + 32) * tiles
    assert sass.count("LDSM.16.MT88.4") == 32  # V^T, transposed
    assert sass.count("LDSM.16.M88.4") == K_STEPS and sass.count("LDSM.16.M88.2") == K_STEPS * tiles
    assert "UBLKCP" in sass and "LDL" not in sass and "STL" not in sass
    # One CTA of the split kernel per SM (the design's wave count assumes it), and it fits.
    assert SM_SHARED_BYTES // 2 < op.smem_bytes() + 1024 <= SM_SHARED_BYTES


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
def test_mla_attention_compiles_for_blackwell(arch, tmp_path):
    """As every kernel (test_compile.test_every_form_compiles_for_blackwell): a port starts from code that builds."""
    for tp in (8, 16):
        (cubin,) = cubins_for(arch, op_for(tp), fake_args(mla_dims(tp).heads), tmp_path / f"tp{tp}")
        assert cubin.endswith(f".{arch}.cubin")


def test_bytes_and_floors():
    """The numbers of the module docstring and the design document: cache bytes (the same at both TPs: every rank
    reads the whole latent cache) and their floor at 4.3 TB/s."""
    for context, m, mb, us in [(4096, 1, 4.719, 1.097), (4096, 8, 37.749, 8.779), (4096, 64, 301.990, 70.230),
                               (32768, 1, 37.749, 8.779), (32768, 8, 301.990, 70.230),
                               (32768, 64, 2415.919, 561.842)]:
        for heads in (12, 6):
            parts = mla_attention_bytes(m, context, heads)
            assert parts["cache"] == m * context * 1152
            assert round(parts["cache"] / 1e6, 3) == mb and round(floor_us(parts["cache"]), 3) == us
            assert parts["cache"] / sum(parts.values()) > 0.99
    assert mla_partial_bytes(1, 132, 12) == 3_256_704


def test_split_counts_fill_one_wave():
    assert [choose_splits(m, 32768) for m in (1, 2, 7, 8, 33, 64)] == [132, 66, 18, 16, 4, 2]
    assert [choose_splits(1, n) for n in (1, 64, 65, 128, 129, 4096)] == [1, 1, 1, 1, 2, 32]
    for m in range(1, 65):
        assert m * choose_splits(m, 32768) <= 132
    with pytest.raises(ValueError, match="M=65"):
        choose_splits(65, 4096)


def test_unsupported_heads_and_scale_are_rejected():
    for heads in (0, 17):
        with pytest.raises(ValueError, match=f"heads={heads} must be in 1..16"):
            MlaSplitKv(heads, 0.1)
    with pytest.raises(ValueError, match="scale"):
        MlaSplitKv(12, 0.0)


def test_lengths_past_the_table_and_pages_outside_the_pool_are_rejected():
    check_cache_inputs([1, 64, 128], [[3, 0], [1, 9], [4, 5]], 10)
    with pytest.raises(ValueError, match=r"seq_lens \[0, 129\] outside 1..128"):
        check_cache_inputs([0, 129], [[0, 1], [2, 3]], 4)
    with pytest.raises(ValueError, match=r"sequence 1 uses pages \[-1\] outside \[0, 4\)"):
        check_cache_inputs([1, 65], [[0, 7], [2, -1]], 4)  # sequence 0's unused entry 7 is not read


def _cpu_args(m=3, heads=6, pool=5, width=4, **override):
    bf16 = torch.bfloat16
    args = dict(q=torch.zeros(m, heads, 576, dtype=bf16), pages=torch.zeros(pool, PAGE, 576, dtype=bf16),
                block_table=torch.zeros(m, width, dtype=torch.int32), seq_lens=torch.ones(m, dtype=torch.int32),
                out=torch.zeros(m, heads, 512, dtype=bf16), stream=None, scale=0.07)
    args.update(override)
    return args


@pytest.mark.parametrize("override, message", [
    (dict(q=torch.zeros(3, 6, 512, dtype=torch.bfloat16)), r"q: expected shape \(3, 6, 576\)"),
    (dict(q=torch.zeros(3, 576, dtype=torch.bfloat16)), r"expected \[M, heads, 576\]"),
    (dict(pages=torch.zeros(5, 64, 576, dtype=torch.float16)), "pages: expected dtype bfloat16"),
    (dict(pages=torch.zeros(5, 32, 576, dtype=torch.bfloat16)), "page size 32"),
    (dict(block_table=torch.zeros(3, 4, dtype=torch.int64)), "block_table: expected dtype int32"),
    (dict(block_table=torch.zeros(2, 4, dtype=torch.int32)), r"block_table: expected shape \(3, 4\)"),
    (dict(block_table=torch.zeros(3, 0, dtype=torch.int32)), "no pages"),
    (dict(seq_lens=torch.ones(3, dtype=torch.int64)), "seq_lens: expected dtype int32"),
    (dict(out=torch.zeros(3, 6, 512, dtype=torch.float32)), "out: expected dtype bfloat16"),
    (dict(q=torch.zeros(3, 17, 576, dtype=torch.bfloat16)), "heads=17"),
    (dict(workspace=MlaWorkspace(torch.zeros(3, 2, 6, 512), torch.zeros(3, 1, 6, 2))),
     r"workspace.part_ml: expected shape \(3, 2, 6, 2\)"),
])
def test_host_wrapper_rejects_wrong_shapes_and_dtypes(override, message):
    with pytest.raises(ValueError, match=message):
        mla_attention_decode(**_cpu_args(**override))


def test_host_wrapper_rejects_batches_outside_1_to_64():
    for m in (0, 65):
        with pytest.raises(ValueError, match=f"M={m} must be in 1..64"):
            mla_attention_decode(**_cpu_args(m=m))


def test_host_wrapper_wants_cuda_tensors():
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        mla_attention_decode(**_cpu_args())
