"""CPU checks of the MLA norms-and-row-insert launch (kernels/mla_norms.py): it compiles
for sm_90a at the per-rank qkv_a widths of TP8 and TP16 (dynamic batch and page pool); one token's loads come after
griddepcontrol.wait, one barrier, no local memory; the host side rejects what the kernel does not support before any
launch. Runs in CI without a GPU."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.kernels.mla import projection_shapes  # noqa: E402
from kimi_k3_path.kernels.mla_norms import MlaNormsInsert, fake_args, mla_norms_insert  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402

from test_compile import _cubin_dump  # noqa: E402

PAGE = 64


def op_and_args(tp: int) -> tuple[MlaNormsInsert, tuple]:
    d = layer_dims(named_config("kimi_k3"), tp).mla
    cols, _ = projection_shapes(d)["qkv_a"]
    op = MlaNormsInsert(d.q_lora, d.kv_lora, d.qk_rope, cols, d.cache_row, d.eps)
    return op, fake_args(d.q_lora, d.kv_lora, cols, d.cache_row, PAGE)


@pytest.mark.parametrize("tp", [8, 16])
def test_compiles_with_its_loads_after_the_wait_one_barrier_and_no_local_memory(tp, tmp_path):
    """264 threads (9 warps) own the 1536 + 512 + 64 columns' vectors; projected is read only after
    griddepcontrol.wait (ACQBULK), the two norms' sums meet at one barrier, and three predicated 16-byte stores write
    q_c, the kv part and k_pe."""
    op, args = op_and_args(tp)
    assert op.warps == 9
    sass = _cubin_dump(op, args, tmp_path / "sass", "-sass").splitlines()
    wait = next(i for i, line in enumerate(sass) if "ACQBULK" in line)
    assert not [line for line in sass[:wait] if re.search(r"\bLDG\.", line)]
    assert sum("BAR.SYNC" in line for line in sass) == 1
    assert sum(bool(re.search(r"\bSTG\.E\.128", line)) for line in sass) == 3
    usage = _cubin_dump(op, args, tmp_path / "res", "-res-usage")
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage


@pytest.mark.parametrize(("args", "message"), [
    ((1536, 512, 60, 3648, 572, 1e-5), "rope=60 must be a positive multiple of 8"),
    ((1536, 512, 64, 2000, 576, 1e-5), "fewer than q_lora \\+ kv_lora \\+ rope = 2112"),
    ((1536, 512, 64, 3650, 576, 1e-5), "not 16-byte rows"),
    ((1536, 512, 64, 3648, 640, 1e-5), "a cache row of 640 is not kv_lora \\+ rope = 576"),
    ((1536, 512, 64, 3648, 576, 0.0), "eps=0.0 must be positive"),
])
def test_widths_it_cannot_lay_out_are_rejected(args, message):
    with pytest.raises(ValueError, match=message):
        MlaNormsInsert(*args)


def host_args(m: int = 2, **changed):
    args = dict(projected=torch.zeros(m, 3648, dtype=torch.bfloat16), q_a_norm=torch.ones(1536, dtype=torch.bfloat16),
                kv_a_norm=torch.ones(512, dtype=torch.bfloat16), eps=1e-5, rope=64,
                pages=torch.zeros(4, PAGE, 576, dtype=torch.bfloat16), slots=torch.arange(m, dtype=torch.int64),
                q_c=torch.zeros(m, 1536, dtype=torch.bfloat16), stream=None)
    return {**args, **changed}


@pytest.mark.parametrize(("changed", "message"), [
    ({"slots": torch.arange(2, dtype=torch.int32)}, "slots: expected dtype int64"),
    ({"q_c": torch.zeros(2, 1535, dtype=torch.bfloat16)}, r"q_c: expected shape \(2, 1536\)"),
    ({"projected": torch.zeros(2, 3648)}, "projected: expected dtype bfloat16"),
    ({"pages": torch.zeros(4 * PAGE, 576, dtype=torch.bfloat16)}, r"expected \[M, N\] and \[P, page, row\]"),
    ({"kv_a_norm": torch.ones(256, dtype=torch.bfloat16)}, "a cache row of 576 is not kv_lora \\+ rope = 320"),
])
def test_the_host_side_names_the_bad_argument_before_any_launch(changed, message):
    with pytest.raises(ValueError, match=message):
        mla_norms_insert(**host_args(**changed))


def test_batches_outside_1_to_64_and_cpu_tensors_are_refused():
    with pytest.raises(ValueError, match="decode batch M=65"):
        mla_norms_insert(**host_args(65))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        mla_norms_insert(**host_args())
