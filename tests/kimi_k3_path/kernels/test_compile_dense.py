"""CPU checks of the dense decode projection (kernels/dense.py): it compiles for sm_90a at the KDA attention's
projections (in_proj, o_proj, f_b at TP8 and TP16) and the MLA attention's (qkv_a; its o_proj is KDA's shape) for every
token tile a decode batch takes, its one-token form
keeps the front's down-projection register budget with no local memory, and its host side rejects what it does not
support. Runs in CI without a GPU."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

import cutlass.cute as cute  # noqa: E402

from kimi_k3_path.config import named_config  # noqa: E402
from kimi_k3_path.kernels import mla  # noqa: E402
from kimi_k3_path.kernels.dense import DenseDecode, dense_bytes, dense_decode, fake_args, gemv_split  # noqa: E402
from kimi_k3_path.kernels.kda import projection_shapes  # noqa: E402
from kimi_k3_path.reference.dims import layer_dims  # noqa: E402

from test_compile import CTA_THREADS, SM_REGISTERS, _cubin_dump  # noqa: E402


def mla_projections(tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of the MLA attention's two projections on dense.project at one rank (qkv_a replicated q_a / kv_a rows
    and this rank's output gate)."""
    return mla.projection_shapes(layer_dims(named_config("kimi_k3"), tp).mla)


def dense_projections(tp: int) -> dict[str, tuple[int, int]]:
    """Every shape dense_decode serves at one rank: KDA's three and MLA's qkv_a (as "mla_qkv_a")."""
    return {**kda_projections(tp), "mla_qkv_a": mla_projections(tp)["qkv_a"]}


def kda_projections(tp: int) -> dict[str, tuple[int, int]]:
    """(N, K) of the KDA attention's three projections at one rank as kda.py holds them (in_proj's 6284 rows at TP8
    and 3206 at TP16 padded with zero rows to a multiple of MMA_ROWS, for the tensor-core form)."""
    return projection_shapes(layer_dims(named_config("kimi_k3"), tp).kda)


@pytest.mark.parametrize("tp", [8, 16])
@pytest.mark.parametrize("mt", [1, 16, 32, 64])
def test_compiles_for_the_kda_and_mla_projections(tp, mt):
    assert mla_projections(tp)["o_proj"] == kda_projections(tp)["o_proj"]  # one shape: 7168 x 1536 / 768
    for n, k in dense_projections(tp).values():
        assert callable(cute.compile(DenseDecode(n, k, mt), *fake_args(n, k)))


def test_shapes_and_grids_of_record():
    """TP8's in_proj is 6284 x 7168 (q, k, v and the output gate of 12 heads, f_a, beta), 6288 padded: 3144 CTAs of 2
    rows (4 warps a row) at one token, 393 of 16 on the tensor cores; o_proj's 7168 x 1536 rows one warp each, 896 CTAs
    of 8."""
    n, k = kda_projections(8)["in_proj"]
    assert (n, k) == (6288, 7168)
    assert gemv_split(k) == 4 and DenseDecode(n, k, 1).ctas() == 3144
    assert gemv_split(1536) == gemv_split(768) == 1 and DenseDecode(7168, 1536, 1).ctas() == 896
    assert DenseDecode(n, k, 64).ctas() == 393
    assert dense_bytes(1, n, k) == {"weight": 6288 * 7168 * 2, "x": 7168 * 2, "y": 6288 * 2}


@pytest.mark.parametrize("projection", ["in_proj", "o_proj"])
def test_one_token_form_fits_four_ctas_per_sm_without_local_memory(projection, tmp_path):
    """The front's down-projection, whose row dots this is, runs 4 CTAs of 256 threads per SM (<= 64 registers)."""
    n, k = kda_projections(8)[projection]
    usage = _cubin_dump(DenseDecode(n, k, 1), fake_args(n, k), tmp_path, "-res-usage")
    assert "LOCAL:0" in usage, usage
    assert int(re.search(r"REG:(\d+)", usage).group(1)) * CTA_THREADS * 4 <= SM_REGISTERS


@pytest.mark.parametrize(("projection", "steps"), [("in_proj", 7), ("o_proj", 6)])
def test_one_token_form_issues_its_weight_slice_before_it_waits_and_reads_x_after(projection, steps, tmp_path):
    """Launched early behind AttnRes (in_proj) or the recurrent middle (o_proj), a lane's weight loads (LDG...NA: 7
    steps of in_proj's 7168-wide rows over 4 warps, 6 of o_proj's 1536-wide rows, a warp each) go out before
    griddepcontrol.wait (ACQBULK), x's after it: the weights stream while the launch before finishes."""
    n, k = kda_projections(8)[projection]
    sass = _cubin_dump(DenseDecode(n, k, 1), fake_args(n, k), tmp_path, "-sass").splitlines()
    wait = next(i for i, line in enumerate(sass) if "ACQBULK" in line)
    loads = [(i, ".NA" in line) for i, line in enumerate(sass) if re.search(r"\bLDG\.", line)]
    assert [weight for i, weight in loads if i < wait] == [True] * steps
    assert [weight for i, weight in loads if i > wait] == [False] * len(loads[steps:])


def test_rejects_shapes_its_forms_cannot_tile():
    with pytest.raises(ValueError, match="6284 rows is not a multiple of 16"):
        DenseDecode(6284, 7168, 16)  # in_proj unpadded
    with pytest.raises(ValueError, match="not a multiple of 2"):
        DenseDecode(6289, 7168, 1)
    with pytest.raises(ValueError, match="K=7160"):
        DenseDecode(6288, 7160, 1)


def test_host_checks_name_the_bad_argument_before_any_launch():
    x, w, y = torch.zeros(1, 128, dtype=torch.bfloat16), torch.zeros(64, 128, dtype=torch.bfloat16), torch.zeros(
        1, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="decode batch M=65"):
        dense_decode(torch.zeros(65, 128, dtype=torch.bfloat16), w, torch.zeros(65, 64, dtype=torch.bfloat16), None)
    with pytest.raises(ValueError, match="expected \\[M, K\\] and \\[N, K\\]"):
        dense_decode(x[0], w, y, None)
    with pytest.raises(ValueError, match="y: expected shape"):
        dense_decode(x, w, torch.zeros(1, 63, dtype=torch.bfloat16), None)
    with pytest.raises(ValueError, match="w: expected dtype bfloat16"):
        dense_decode(x, w.float(), y, None)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        dense_decode(x, w, y, None)
