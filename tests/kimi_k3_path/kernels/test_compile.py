"""CPU compile checks: every CuTe DSL kernel of the latent-MoE path compiles for sm_90a with fake tensors and a
dynamic batch dimension, at the TP8 and TP16 per-rank shapes of the shipped config. Runs in CI without a GPU."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
from cutlass import BFloat16, Float16, Float32, Int32, Uint8  # noqa: E402

from benchmarks.kimi_k3.bench_moe import H200_SMS  # noqa: E402
from benchmarks.kimi_k3.stream import ReadStream  # noqa: E402
from kimi_k3_path.kernels.finalize_mma import Finalize, finalize_row_tiles  # noqa: E402
from kimi_k3_path.kernels.finalize_streamed import (  # noqa: E402
    STREAMED_CTAS_PER_SM,
    STREAMED_STAGES,
    FinalizeStreamed,
    streamed_ctas,
)
from kimi_k3_path.kernels.fp4_mma import GEMM2_GROUPS_IN_FLIGHT  # noqa: E402
from kimi_k3_path.kernels.front import (  # noqa: E402
    FRONT_DOWN_SPLIT,
    FRONT_ROW_TILES,
    ONE_TOKEN_FRONT_CTAS_PER_SM,
    FrontKernel,
)
from kimi_k3_path.kernels.gemm1_held import ONE_TOKEN_CTAS_PER_SM, ExpertsGemm1Held  # noqa: E402
from kimi_k3_path.kernels.gemm1_mma import ExpertsGemm1SituMma  # noqa: E402
from kimi_k3_path.kernels.gemm2_mma import ExpertsGemm2CombineMma, gemm2_tiles_per_cta  # noqa: E402
from kimi_k3_path.kernels.gemm2_one_token import ONE_TOKEN_ROWS, ExpertsGemm2OneToken  # noqa: E402
from kimi_k3_path.kernels.common import DEFAULT_WEIGHT_LOAD, ctas_per_sm_bound  # noqa: E402
from kimi_k3_path.kernels.gemv import WARPS_PER_CTA, alloc_scratch, gemv_part, token_tile  # noqa: E402
from kimi_k3_path.kernels.router import (  # noqa: E402
    ExpertPlan,
    RouterOutputs,
    RouterShape,
    alloc_router_smem,
    check_router,
    fake_plan,
    router_part,
    router_smem_bytes,
    router_sync_words,
)
from kimi_k3_path.kernels.runtime import dyn, fake, fake_stream  # noqa: E402
from kimi_k3_path.kernels.shared import ONE_TOKEN_SHARED_SPLIT, check_shared  # noqa: E402


SM_REGISTERS = 65536  # per SM on the H200 (sm_90)
SM_SHARED_BYTES = 228 * 1024  # per SM on sm_90, of which each resident CTA takes 1 KB for the system
CTA_THREADS = WARPS_PER_CTA * 32  # every latent-MoE kernel launches 8 warps per CTA
SM_SHARED_BYTES = 228 * 1024  # per SM, of which each resident CTA also takes 1 KB
SM_L1_AND_SHARED_KB = 256  # one array per SM, split between L1 and shared memory at one of these carveouts (sm_90)
SM_CARVEOUTS_KB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)


def _compiles(op, *args) -> None:
    fn = cute.compile(op, *args)
    assert callable(fn)


def _plan(e: int):
    return fake_plan(e)


def _gemm1_args(d):
    m, pairs = dyn(), dyn()
    e, lat, i = d.experts, d.latent, d.intermediate
    return (fake(Float16, (m, lat)), fake(Uint8, (e, 2 * i, lat // 2)), fake(Uint8, (e, 2 * i, lat // 32)), *_plan(e),
            fake(Float16, (pairs, i)), fake(Float32, (m, lat)), fake_stream())


def _finalize_args(d):
    m, h, lat, s = dyn(), d.hidden, d.latent, d.shared_intermediate
    return (fake(BFloat16, (m, lat)), fake(BFloat16, (h, lat)), fake(BFloat16, (m, s)), fake(BFloat16, (h, s)),
            fake(BFloat16, (m, h)), fake_stream())


def _gemm2_args(d):
    m, pairs = dyn(), dyn()
    e, lat, i = d.experts, d.latent, d.intermediate
    return (fake(Float16, (pairs, i)), fake(Uint8, (e, lat, i // 2)), fake(Uint8, (e, lat, i // 32)), *_plan(e),
            fake(Float32, (m, d.top_k)), fake(Float32, (m, lat)), fake(Int32, (2,)), fake(Float32, (lat,)),
            fake(BFloat16, (m, lat)), fake_stream())


@pytest.mark.parametrize("tp", [8, 16])
def test_tensor_core_experts_compile(tp, dims):
    d = dims(tp)
    _compiles(ExpertsGemm1SituMma(d.experts, d.latent, d.intermediate, d.top_k), *_gemm1_args(d))
    _compiles(ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps), *_gemm2_args(d))


def _cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    triton = pytest.importorskip("triton", reason="no cuobjdump on PATH and no Triton to borrow it from")
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not bundled.exists():
        pytest.skip(f"no cuobjdump on PATH or at {bundled}")
    return str(bundled)


def cubins_for(arch: str, op, args, dump_dir: Path) -> list[str]:
    """The names of the cubins op compiles to for `arch` (e.g. sm_100a), kept in dump_dir (created)."""
    dump_dir.mkdir(parents=True)
    cute.compile(op, *args, options=f"--gpu-arch {arch} --keep-cubin --dump-dir={dump_dir}")
    return [cubin.name for cubin in dump_dir.glob("*.cubin")]


def _cubin_dump(op, args, dump_dir: Path, what: str) -> str:
    """cuobjdump `what` (-sass, -res-usage) of op compiled for sm_90a, its cubin kept in dump_dir."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    cute.compile(op, *args, options=f"--keep-cubin --dump-dir={dump_dir}")
    (cubin,) = dump_dir.glob("*.cubin")
    return subprocess.run([_cuobjdump(), what, str(cubin)], capture_output=True, text=True, check=True).stdout


def test_kernels_compile_for_the_h200(dims, tmp_path):
    """The compile checks and SASS tests below inspect sm_90a code: tests/conftest.py sets CUTE_DSL_ARCH before
    cutlass is imported (set later, the DSL quietly built for sm_100a, where the front at a 32-token tile has 80
    registers instead of 112)."""
    assert os.environ.get("CUTE_DSL_ARCH") == "sm_90a"
    _cubin_dump(_front(dims(8), 32, True), _front_args(dims(8)), tmp_path, "-res-usage")
    (cubin,) = tmp_path.glob("*.cubin")
    assert cubin.name.endswith(".sm_90a.cubin"), cubin.name


def _sass(op, args, dump_dir: Path) -> list[str]:
    return _cubin_dump(op, args, dump_dir, "-sass").splitlines()


def _registers(op, args, dump_dir: Path) -> int:
    """Registers per thread of op's kernel (cuobjdump -res-usage)."""
    return int(re.search(r"REG:(\d+)", _cubin_dump(op, args, dump_dir, "-res-usage")).group(1))


@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"])
@pytest.mark.parametrize("tp", [8, 16])
def test_expert_weight_loads_and_activations_of_a_batch_precede_its_first_mma(tp, gemm, dims, tmp_path):
    """The CTA's weight rows arrive by bulk copies (UBLKCP), no weight word is loaded from global memory, and all of a
    batch's 16-byte activation loads come before its first HMMA: ptxas sinks each load next to its first use unless
    common.after_all_loads pins the batch (without it, one round trip per group)."""
    d = dims(tp)
    if gemm == "gemm1":
        op, args = ExpertsGemm1SituMma(d.experts, d.latent, d.intermediate, d.top_k), _gemm1_args(d)
    else:
        op, args = ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps), _gemm2_args(d)
    lines = _sass(op, args, tmp_path)
    first_mma = next(n for n, line in enumerate(lines) if "HMMA" in line)
    assert any("UBLKCP" in line for line in lines)
    assert not any("LDG.E.NA" in line for line in lines)
    assert sum("LDG.E.128" in line for line in lines[:first_mma]) == op.in_flight


@pytest.mark.parametrize("tiles", [1, None])
@pytest.mark.parametrize("tp", [8, 16])
def test_early_gemm2_reads_gemm1_results_only_after_it_waits(tp, tiles, dims, tmp_path):
    """GEMM2 launched early: all of its weight copies (UBLKCP: two per tile, the warp's rows and the scales) are issued
    before griddepcontrol.wait (ACQBULK); every activation load (a, GEMM1's output) comes after the wait and none
    takes the read-only path (.CONSTANT), which is undefined for data GEMM1 may still be writing; GEMM1 lets it start
    (PREEXIT) before any load of its own."""
    d = dims(tp)
    op = ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps, tiles=tiles)
    gemm2 = _sass(op, _gemm2_args(d), tmp_path / "gemm2")
    wait = next(n for n, line in enumerate(gemm2) if "ACQBULK" in line)
    copies = [n for n, line in enumerate(gemm2) if "UBLKCP" in line]
    activations = [n for n, line in enumerate(gemm2) if "LDG.E.128" in line]
    assert len(copies) == 2 * op.tiles and all(n < wait for n in copies)
    assert not any("LDG.E.NA" in line for line in gemm2)
    assert activations and min(activations) > wait
    assert not any("CONSTANT" in gemm2[n] for n in activations)
    gemm1 = _sass(ExpertsGemm1SituMma(d.experts, d.latent, d.intermediate, d.top_k), _gemm1_args(d),
                  tmp_path / "gemm1")
    trigger = next(n for n, line in enumerate(gemm1) if "PREEXIT" in line)
    assert trigger < next(n for n, line in enumerate(gemm1) if "LDG" in line)


@pytest.mark.parametrize("tiles", [1, None])
@pytest.mark.parametrize("tp", [8, 16])
def test_gemm2_keeps_four_ctas_per_sm(tp, tiles, dims, tmp_path):
    """GEMM2's registers (cuobjdump -res-usage; 60-64 when measured) and shared memory leave room for 4 CTAs of 256
    threads per SM in either form (its A/B on the H100 ran at 4): a rewrite of the norm tail with a loop from the
    CTA's first token in steps of the tail size once took a GEMM2 form to 140 registers (1 CTA per SM)."""
    d = dims(tp)
    op = ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps, tiles=tiles)
    registers = _registers(op, _gemm2_args(d), tmp_path)
    assert registers * CTA_THREADS * 4 <= SM_REGISTERS, f"{registers} registers per thread"
    assert 4 * (op.smem_bytes() + 1024) <= SM_SHARED_BYTES, f"{op.smem_bytes()} bytes of shared memory"


def test_gemm2_stages_the_most_tiles_that_fit_56_kb_and_divide_the_latent_rows():
    assert gemm2_tiles_per_cta(3584, 384) == 2  # 2 x 26 KB at TP8
    assert gemm2_tiles_per_cta(3584, 192) == 4  # 4 x 13 KB at TP16 (28 tiles: 7 would be 91 KB)
    assert ExpertsGemm2CombineMma(896, 3584, 192, 16, 1e-5).ctas_per_slot() == 7
    with pytest.raises(ValueError, match="3 tiles per CTA do not divide the 28 tiles of 128 latent rows"):
        ExpertsGemm2CombineMma(896, 3584, 384, 16, 1e-5, tiles=3)


def test_gemm2_batches_its_groups_equally_at_most_4_at_a_time():
    assert ExpertsGemm2CombineMma(896, 3584, 384, 16, 1e-5).in_flight == GEMM2_GROUPS_IN_FLIGHT  # 12 groups: 3 x 4
    assert ExpertsGemm2CombineMma(896, 3584, 192, 16, 1e-5).in_flight == 3  # TP16: 6 groups as 3 + 3, not 4 + 2


@pytest.mark.parametrize("mt", [16, 32, 64])
@pytest.mark.parametrize("tp", [8, 16])
def test_tensor_core_finalize_compiles(tp, mt, dims):
    d = dims(tp)
    _compiles(Finalize(d.hidden, d.latent, d.shared_intermediate, mt), *_finalize_args(d))


@pytest.mark.parametrize("row_tiles", [2, 4])
def test_finalize_compiles_with_other_row_tiles(row_tiles, dims):
    d = dims(8)
    _compiles(Finalize(d.hidden, d.latent, d.shared_intermediate, 16, row_tiles=row_tiles), *_finalize_args(d))


def test_finalize_covers_its_rows_in_tiles_of_16_per_cta(dims):
    """mma.py's row tiles: R tiles of 16 output rows per CTA, so hidden / 16R CTAs (7168 rows: 224 at R = 2); two
    at 64 tokens, one below (finalize_row_tiles)."""
    d = dims(8)
    assert [finalize_row_tiles(mt) for mt in (16, 32, 64)] == [1, 1, 2]
    assert Finalize(d.hidden, d.latent, d.shared_intermediate, 64).ctas() == d.hidden // 32 == 224
    assert Finalize(d.hidden, d.latent, d.shared_intermediate, 16).ctas() == d.hidden // 16
    assert Finalize(d.hidden, d.latent, d.shared_intermediate, 64, row_tiles=1).ctas() == d.hidden // 16
    with pytest.raises(ValueError, match="3 row tiles per CTA do not divide its 8 warps"):
        Finalize(d.hidden, d.latent, d.shared_intermediate, 64, row_tiles=3)
    with pytest.raises(ValueError, match="hidden=48 is not a multiple of 32"):
        Finalize(48, d.latent, d.shared_intermediate, 64)
    assert Finalize(48, d.latent, d.shared_intermediate, 16).ctas() == 3


@pytest.mark.parametrize("tp", [8, 16])
def test_early_finalize_reads_everything_only_after_it_waits(tp, dims, tmp_path):
    """The finalize launched early (GEMM2 lets it start after its MMAs, PREEXIT): every load, weights (L1::no_allocate) and
    activations (normed, a_sh), comes after griddepcontrol.wait (ACQBULK), and no activation load takes the read-only
    path (.CONSTANT), undefined for data written while the launch runs."""
    d = dims(tp)
    op = Finalize(d.hidden, d.latent, d.shared_intermediate, 16)
    lines = _sass(op, _finalize_args(d), tmp_path / "finalize")
    wait = next(n for n, line in enumerate(lines) if "ACQBULK" in line)
    loads = [n for n, line in enumerate(lines) if "LDG" in line]
    weights = [n for n in loads if ".NA" in lines[n]]
    activations = [n for n in loads if ".NA" not in lines[n]]
    assert activations and min(activations) > wait
    assert not any("CONSTANT" in lines[n] for n in activations)
    assert weights and min(weights) > wait
    gemm2 = _sass(ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps), _gemm2_args(d),
                  tmp_path / "gemm2")
    # GEMM2 lets the finalize in only after its MMAs (its waiting CTAs would take room from GEMM2's last wave)
    let_in = [n for n, line in enumerate(gemm2) if "PREEXIT" in line]
    assert len(let_in) == 1 and let_in[0] > max(n for n, line in enumerate(gemm2) if "HMMA" in line)


class _FrontPart:
    """One of the one-token front's device functions alone in a kernel of its own (router.router_part over the router
    CTAs, or gemv.gemv_part over the down-projection's): the front runs both in one grid, where their SASS mixes."""

    def __init__(self, d, part: str):
        self.d, self.part = d, part
        self.router = RouterShape(d.experts, d.hidden, d.top_k, d.routed_scaling_factor, 1)

    def ctas(self) -> int:
        return self.router.ctas if self.part == "router" else self.d.latent // (WARPS_PER_CTA // FRONT_DOWN_SPLIT)

    @cute.jit
    def __call__(self, x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count,
                 slot_pairs, w_down, x_lat, w_sh13, a_sh, stream):
        self.kernel(x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
                    w_down, x_lat, x.shape[0]).launch(
            grid=[self.ctas(), 1, 1], block=[CTA_THREADS, 1, 1],
            smem=router_smem_bytes(self.d.experts, self.d.top_k, one_token=True), stream=stream,
            **ctas_per_sm_bound(ONE_TOKEN_FRONT_CTAS_PER_SM))

    @cute.kernel
    def kernel(self, x, w_router, bias, logits, sync, ids, weights, n_active, slot_expert, slot_count, slot_pairs,
               w_down, x_lat, m_count: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        smem = cutlass.memory.SmemAllocator()
        state = alloc_router_smem(smem, self.d.experts, self.d.top_k, one_token=True)
        scratch = alloc_scratch(smem)
        if cutlass.const_expr(self.part == "router"):
            router_part(x, w_router, bias, RouterOutputs(logits, sync, ids, weights),
                        ExpertPlan(n_active, slot_expert, slot_count, slot_pairs), state, scratch, None, bidx, tidx,
                        m_count, self.router)
        else:
            gemv_part(x, w_down, x_lat, scratch, bidx, tidx // 32, tidx % 32, m_count, self.d.hidden,
                      FRONT_DOWN_SPLIT, 1, DEFAULT_WEIGHT_LOAD, wait=True)


@pytest.mark.parametrize(("part", "loads"), [("router", 7), ("down_projection", 7)])
def test_one_token_front_weight_loads_all_precede_the_first_fma(part, loads, dims, tmp_path):
    """gemv.dot_slice pins a lane's weight loads (LDG...NA) ahead of its first FMA: ptxas had issued a few ahead and
    sunk the rest next to their uses, a DRAM round trip each. One token: the router's 7 steps of one row (a row over
    4 warps), the down-projection's 7. And the words stay packed until their FMAs, in 64 registers or fewer (4 CTAs
    of 256 threads per SM): LLVM had hoisted the loads out of the one-pass tile loop with their bf16 -> fp32
    conversions, two registers per word held across it (the router 109 registers, the down-projection 94); each part
    is compiled with the front's bound, and spilling (stack) is what would show it. Launched early behind AttnRes,
    the front issues those loads before griddepcontrol.wait (ACQBULK) and reads x only after it."""
    d = dims(8)
    op, args = _FrontPart(d, part), _front_args(d)
    lines = _sass(op, args, tmp_path / "sass")
    first_fma = next(n for n, line in enumerate(lines) if "FFMA" in line)
    assert sum(1 for line in lines[:first_fma] if "LDG" in line and ".NA" in line) == loads
    wait = next(n for n, line in enumerate(lines) if "ACQBULK" in line)
    before_wait = [".NA" in line for line in lines[:wait] if re.search(r"\bLDG\.", line)]
    assert before_wait == [True] * loads
    usage = _cubin_dump(op, args, tmp_path / "res", "-res-usage")
    assert int(re.search(r"REG:(\d+)", usage).group(1)) <= SM_REGISTERS // (4 * CTA_THREADS)
    assert "STACK:0 " in usage and "LOCAL:0 " in usage, usage


def _streamed_finalize(d, trace_addr: int = 0) -> FinalizeStreamed:
    return FinalizeStreamed(d.hidden, d.latent, d.shared_intermediate, d.latent // ONE_TOKEN_ROWS, d.eps,
                            streamed_ctas(H200_SMS), STREAMED_STAGES, trace_addr)


@pytest.mark.parametrize(("tp", "fused", "vecs"), [(8, False, 5), (16, True, 4)])
def test_streamed_finalize_fuses_its_two_slices_where_that_saves_a_step(tp, fused, vecs, dims):
    """A warp's 112 up vectors leave the last of 4 steps half empty; the shared part fills it at TP16 (12 vectors: 4
    steps instead of 5, v38d: the finalize alone -1.3 us) and not at TP8 (24: 5 either way, where fusing cost
    0.2-0.3 us in the block)."""
    op = _streamed_finalize(dims(tp))
    assert (op.fused, op.vecs) == (fused, vecs)


def _streamed_finalize_args(d):
    h, lat, s = d.hidden, d.latent, d.shared_intermediate
    return (fake(BFloat16, (1, lat)), fake(BFloat16, (h, lat)), fake(BFloat16, (1, s)), fake(BFloat16, (h, s)),
            fake(Float32, (lat // ONE_TOKEN_ROWS,)), fake(BFloat16, (1, h)), fake_stream())


@pytest.mark.parametrize("tp", [8, 16])
def test_streamed_finalize_copies_ahead_of_its_wait_and_fits_its_ctas_per_sm(tp, dims, tmp_path):
    """FinalizeStreamed (v22d, v23b): its weights reach shared memory only by cp.async (LDGSTS; no weight is loaded
    into registers), STREAMED_STAGES - 1 row pairs' copies issued before griddepcontrol.wait (ACQBULK) and one pair's
    in the loop; every activation load comes after the wait, none on the read-only path (.CONSTANT), undefined for
    data written while the launch runs; each copy carries L2's evict_first policy (PTX); and its registers and shared
    memory fit STREAMED_CTAS_PER_SM CTAs per SM without a spill."""
    d = dims(tp)
    cute.compile(_streamed_finalize(d), *_streamed_finalize_args(d),
                 options=f"--keep-ptx --keep-cubin --dump-dir={tmp_path}")
    (ptx,), (cubin,) = tmp_path.glob("*.ptx"), tmp_path.glob("*.cubin")

    def dump(what: str) -> str:
        return subprocess.run([_cuobjdump(), what, str(cubin)], capture_output=True, text=True, check=True).stdout

    op = _streamed_finalize(d)
    lines = dump("-sass").splitlines()
    wait = next(n for n, line in enumerate(lines) if "ACQBULK" in line)
    copies = [n for n, line in enumerate(lines) if "LDGSTS" in line]
    loads = [n for n, line in enumerate(lines) if re.search(r"\bLDG\.", line)]  # not LDGSTS nor LDGDEPBAR
    assert sum(n < wait for n in copies) == (STREAMED_STAGES - 1) * op.vecs
    assert len(copies) == STREAMED_STAGES * op.vecs
    assert loads and min(loads) > wait and not any("CONSTANT" in lines[n] or ".NA" in lines[n] for n in loads)
    copies_ptx = [line for line in ptx.read_text().splitlines() if "cp.async.cg.shared.global" in line]
    assert len(copies_ptx) == len(copies) and all("L2::cache_hint" in line for line in copies_ptx)
    assert "createpolicy.fractional.L2::evict_first" in ptx.read_text()
    usage = dump("-res-usage")
    registers, stack = (int(re.search(rf"{what}:(\d+)", usage).group(1)) for what in ("REG", "STACK"))
    assert registers * CTA_THREADS * STREAMED_CTAS_PER_SM <= SM_REGISTERS, f"{registers} registers per thread"
    assert stack == 0, f"{stack} bytes of stack (spills)"
    assert STREAMED_CTAS_PER_SM * (op.smem_bytes() + 1024) <= SM_SHARED_BYTES, f"{op.smem_bytes()} bytes per CTA"


def _front_args(d):
    m = dyn()
    e, h, lat, s, k = d.experts, d.hidden, d.latent, d.shared_intermediate, d.top_k
    return (fake(BFloat16, (m, h)), fake(BFloat16, (e, h)), fake(Float32, (e,)), fake(Float32, (m, e)),
            fake(Int32, (router_sync_words(e),)), fake(Int32, (m, k)), fake(Float32, (m, k)), *_plan(e),
            fake(BFloat16, (lat, h)), fake(Float16, (m, lat)), fake(BFloat16, (2 * s, h)), fake(BFloat16, (m, s)),
            fake_stream())


def _front(d, mt: int, router_mma: bool = False) -> FrontKernel:
    return FrontKernel(d.experts, d.hidden, d.latent, d.shared_intermediate, d.top_k, d.routed_scaling_factor, mt,
                       token_tile(mt, tensor_cores=False), router_mma=router_mma)


@pytest.mark.parametrize(("mt", "router_mma"), [(8, False), (64, False), (16, True), (64, True)])
@pytest.mark.parametrize("tp", [8, 16])
def test_front_kernel_compiles(tp, mt, router_mma, dims):
    _compiles(_front(dims(tp), mt, router_mma), *_front_args(dims(tp)))


def test_front_router_on_tensor_cores_needs_their_token_tile(dims):
    with pytest.raises(ValueError, match="router_mma needs the tensor-core token tile"):
        _front(dims(8), 8, router_mma=True)


@pytest.mark.parametrize("mt", [16, 64])
def test_front_router_on_tensor_cores_takes_one_cta_per_16_experts(mt, dims):
    """The router's logits CTAs come first in the front's grid: one per expert or per two on the CUDA cores
    (router.router_split), one per 16 on the tensor cores (the selecting tail then waits for 56 CTAs at E = 896)."""
    d = dims(8)
    assert _front(d, mt).router_ctas == d.experts // 2  # router tile 8 (router.router_split)
    assert _front(d, 1).router_ctas == d.experts // 2
    assert _front(d, mt, router_mma=True).router_ctas == d.experts // 16


@pytest.mark.parametrize("tp", [8, 16])
def test_front_tensor_core_ctas_own_row_tiles_the_router_ctas_one(tp, dims):
    """From 2 tokens the down-projection and shared CTAs own FRONT_ROW_TILES tiles of 16 rows (the shared ones 8
    (gate, up) columns a tile); the router's stay at 16 experts a CTA; at one token nothing changes."""
    d = dims(tp)
    r = FRONT_ROW_TILES
    front = _front(d, 64, router_mma=True)
    assert (front.router_ctas, front.down_ctas, front.shared_ctas) == (
        d.experts // 16, d.latent // (16 * r), d.shared_intermediate // (8 * r))
    one = _front(d, 1)
    assert (one.down_ctas, one.row_tiles) == (d.latent // 2, 1)  # FRONT_DOWN_SPLIT 4: 2 rows a CTA
    with pytest.raises(ValueError, match="shared intermediate=24 is not a multiple of 16"):
        FrontKernel(d.experts, d.hidden, d.latent, 24, d.top_k, d.routed_scaling_factor, 64, 8)


def _instruction(line: str) -> str:
    """A SASS listing line's instruction text, without its address comment, ';' and encoding."""
    return line.split(";")[0].split("*/")[-1].strip()


def _sass_ops(sass: list[str]) -> list[str]:
    """The opcode (with its modifiers) of every instruction line of a SASS listing, predicates dropped."""
    ops = [_instruction(line).split() for line in sass if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    return [op[1] if op[0].startswith("@") else op[0] for op in ops if op]


@pytest.mark.parametrize(("mt", "router_mma"), [(1, False), (8, False), (16, True)])
def test_front_counts_its_router_ctas_in_only_when_the_logits_are_on_the_tensor_cores(mt, router_mma, dims,
                                                                                     tmp_path):
    """v30: on the CUDA cores the router CTAs store their logits with a strong store and leave; the selecting warps
    poll for them. One ATOMG.ADD is left: the selecting CTAs' count-in before the plan; at one token none, nor any
    other atomic (v41: the selecting CTA's warps write the plan themselves). The tensor-core logits are plain stores,
    fenced by every CTA's count-in (ATOMG.ADD), the waiters' count-out (another) and the plan's."""
    d = dims(8)
    ops = _sass_ops(_sass(_front(d, mt, router_mma), _front_args(d), tmp_path))
    adds = [op for op in ops if op.startswith("ATOMG") and ".ADD" in op]
    assert len(adds) == (3 if router_mma else 0 if mt == 1 else 1), adds
    if mt == 1:
        assert not [op for op in ops if op.startswith(("ATOM", "RED."))]
    assert ("STG.E.STRONG.GPU" in ops) != router_mma  # router.publish_logit


def test_one_token_selection_splits_the_experts_evenly_over_at_most_8_warps():
    """router.select_one_token: each picking warp takes E / 32 / w slots a lane (a run of 32 * slots experts) and
    picks k candidates; the final warp's w * k candidates fit its lanes' slots."""
    from kimi_k3_path.kernels.router import ONE_TOKEN_CANDIDATES, one_token_warps

    assert {e: one_token_warps(e) for e in (64, 384, 896, 1024)} == {64: 2, 384: 6, 896: 7, 1024: 8}
    assert one_token_warps(896) * 32 + 32 <= ONE_TOKEN_CANDIDATES  # each picker's k <= 32, then the final k


def test_token_tile_covers_every_batch():
    batches = (1, 2, 3, 4, 5, 8, 9, 16, 17, 33, 64, 65)
    assert [token_tile(m) for m in batches] == [1, 16, 16, 16, 16, 16, 16, 16, 32, 64, 64, 8]
    assert [token_tile(m, tensor_cores=False) for m in batches] == [1, 2, 4, 4, 8, 8, 8, 8, 8, 8, 8, 8]


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: check_shared(768, 7176, 1), "not a multiple of 64 \\(16-byte loads, 8-way split"),
        (lambda: FrontKernel(896, 7168, 3583, 768, 16, 1.0, 1, 1), "latent=3583 is not a multiple of 2"),
        (lambda: check_router(896, 7168, 33), "top_k=33"),
        (lambda: check_router(928, 7168, 16), "experts=928 is not a multiple of 64"),
        (lambda: ExpertsGemm2CombineMma(896, 3584, 100, 16, 1e-5), "intermediate=100"),
        (lambda: Finalize(7168, 3584, 100, 16), "K=100"),
        (lambda: Finalize(7168, 3584, 768, 1), "token tile 1 is not a tensor-core tile"),
        (lambda: FrontKernel(896, 7168, 3592, 768, 16, 1.0, 16, 8), "3592 rows is not a multiple of 16"),
        (lambda: ExpertsGemm1SituMma(896, 3584, 80, 16), "intermediate=80 is not a multiple of 32"),
        (lambda: ExpertsGemm1SituMma(896, 3200, 384, 16), "latent=3200 is not a multiple of 256"),
        (lambda: Finalize(7168, 3584, 48, 64), "K=48 is not a multiple of 32"),
        (lambda: ExpertsGemm2OneToken(896, 3584, 384, 8), "top_k=8 must be 16"),
        (lambda: ExpertsGemm2OneToken(896, 3584, 100, 16), "intermediate=100"),
        (lambda: ExpertsGemm2OneToken(896, 3584, 384, 16, 768, 7168, shared_split=3), "split=3 must divide"),
        (lambda: ExpertsGemm2OneToken(896, 3584, 384, 16, 767, 7168, shared_split=4),
         "intermediate=767 is not a multiple of 2 \\(row pairs per CTA at split 4\\)"),
        (lambda: ExpertsGemm1Held(896, 3000, 384, 16, True), "latent=3000 must be a multiple of 512"),
        (lambda: ExpertsGemm1Held(896, 3584, 100, 16, False), "intermediate=100 is not a multiple of 8"),
        (lambda: ReadStream(2, via="tma"), "via='tma' is not one of"),
        (lambda: FinalizeStreamed(7168, 3584, 768, 448, 1e-5, 396, 1), "stages=1 must be at least 2"),
        (lambda: FinalizeStreamed(7168, 3584, 768, 0, 1e-5, 396, 3), "rms_parts=0 at least 1"),
        (lambda: FinalizeStreamed(7168, 3584, 100, 448, 1e-5, 396, 3), "K=100"),
    ],
)
def test_unsupported_shapes_are_rejected_with_the_reason(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_host_checks_name_the_bad_argument():
    import torch

    from kimi_k3_path.kernels.finalize_mma import finalize_mma

    normed = torch.zeros(2, 256, dtype=torch.bfloat16)
    w_up = torch.zeros(32, 256, dtype=torch.bfloat16)
    a_sh = torch.zeros(2, 64, dtype=torch.bfloat16)
    w_sh2 = torch.zeros(32, 64, dtype=torch.bfloat16)
    out = torch.zeros(2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="normed: expected dtype bfloat16, got torch.float32"):
        finalize_mma(normed.float(), w_up, a_sh, w_sh2, out, stream=None)
    with pytest.raises(ValueError, match="normed: must be a CUDA tensor"):
        finalize_mma(normed, w_up, a_sh, w_sh2, out, stream=None)


def test_front_keeps_one_chunk_in_flight_only_with_its_router_on_the_tensor_cores_at_16_tokens(dims):
    """v15d: chunks in flight per warp by token tile (mma.chunks_in_flight: 2 up to 16 tokens, 3 above), except the
    front with its router on the tensor cores in a 16-token tile (1)."""
    from kimi_k3_path.kernels.mma import chunks_in_flight

    d = dims(8)
    assert [chunks_in_flight(mt) for mt in (16, 32, 64)] == [2, 3, 3]
    assert [_front(d, 16, False).in_flight, _front(d, 16, True).in_flight] == [2, 1]
    assert [_front(d, 64, False).in_flight, _front(d, 64, True).in_flight] == [3, 3]
    assert _front(d, 1).in_flight == 0  # the CUDA-core front has no MMA chunks




@pytest.mark.parametrize(("mt", "router_mma", "ctas_per_sm", "l1_kb"),
                         [(1, False, 4, 192), (16, False, 2, 124), (16, True, 3, 60), (32, True, 2, 124),
                          (64, True, 2, 92)])
@pytest.mark.parametrize("tp", [8, 16])
def test_front_keeps_the_occupancy_and_l1_it_was_measured_at(tp, mt, router_mma, ctas_per_sm, l1_kb, dims,
                                                             tmp_path):
    """CTAs per SM of the block's front at each token tile, from the cubin's registers (allocated in units of 8 per
    thread) and the launch's shared memory, and the L1 those CTAs' shared memory leaves: the SM's 256 KB less the
    smallest carveout that holds them (the driver's choice without a preference: ncu read 135 KB configured for 2 x 58
    KB and 201 KB for 3, v40b).
    Occupancy decides how much L1 is left for x, which every CTA rereads (v10g: 4 CTAs per SM at 4 tokens took the
    front from 41 to 58 us), and v15d saw the front move by 2x with its chunk order. L1 matters at one token too:
    v31a's one-token front at 100 KB of shared memory per CTA (the same 2 CTAs per SM, L1 28 KB) took 21.9 us alone
    against 18.5, and the M=8 block 183 us against 161; and so does occupancy itself: with 78 registers (v40) 3 CTAs
    per SM took it to 19.1 us alone at L1 92 KB against 18.0 at 2, and 4 at L1 ~60 KB to 21.1-21.5 (v41a), but 4
    with the one-token selection's 9.8 KB of shared memory (L1 192 KB, bounded to 64 registers) to 17.1-17.2 against
    18.2-18.6 (v41g). A change that moves these numbers needs a new measurement on the H200 and this table
    (docs/design/kimi_k3_kernels.md)."""
    d = dims(tp)
    op = _front(d, mt, router_mma)
    registers = -(-_registers(op, _front_args(d), tmp_path) // 8) * 8
    by_registers = SM_REGISTERS // (registers * CTA_THREADS)
    by_shared = SM_SHARED_BYTES // (op.smem_bytes() + 1024)
    ctas = min(by_registers, by_shared)
    shared = ctas * (op.smem_bytes() + 1024)
    l1 = SM_L1_AND_SHARED_KB - next(kb for kb in SM_CARVEOUTS_KB if kb * 1024 >= shared)
    assert (ctas, l1) == (ctas_per_sm, l1_kb), (
        f"{registers} registers, {op.smem_bytes()} bytes of smem: the front's occupancy or L1 moved (a kernel change, "
        f"or another CuTe DSL / ptxas version); time it on the H200 (docs/design/kimi_k3_kernels.md) before updating"
        " this table")


@pytest.mark.parametrize("in_flight", [2, 4, 8])
@pytest.mark.parametrize("wait", ["none", "start", "held"])
def test_read_stream_keeps_each_batch_of_loads_in_flight_together(in_flight, wait, tmp_path):
    """The read-only yardstick (stream.py) measures `in_flight` 16-byte loads per thread in flight: in its batch loop
    every load precedes the first XOR (ptxas had interleaved them 4 by 4 at 8 in flight before after_all_loads, and at
    16 it still issues the last one after folding the others, so the bench stops at 8), and
    "start" waits for the predecessor before any load, "held" only after its first batch is issued."""
    op = ReadStream(in_flight, wait, trigger=True)
    sass = _sass(op, (fake(Int32, (dyn(),)), fake(Int32, (dyn(),)), Int32(1), fake_stream()), tmp_path)
    ops = [op for op in _sass_ops(sass) if op.startswith(("LDG", "LOP3", "ACQBULK"))]
    first_load = ops.index(next(op for op in ops if op.startswith("LDG")))
    batch = ops[first_load:first_load + in_flight + 1]
    assert all(op.startswith("LDG") for op in batch[:in_flight]) and batch[in_flight].startswith("LOP3"), batch
    waits = [i for i, op in enumerate(ops) if op == "ACQBULK"]
    if wait == "none":
        assert not waits
    elif wait == "start":
        assert waits and waits[0] < first_load
    else:
        assert waits and waits[0] > first_load + in_flight


@pytest.mark.parametrize("via", ["cp.async", "bulk"])
@pytest.mark.parametrize("wait", ["none", "held"])
def test_staged_read_stream_has_each_batch_in_flight_without_registers(via, wait, tmp_path):
    """The yardstick's staged reads (v22b): a batch's 16-byte vectors come in by 4 cp.async copies per thread or 4
    bulk copies from one thread, all issued before the wait for them (and, "held", before the predecessor's wait),
    and are read back from shared memory, not loaded into registers; registers stay few."""
    op = ReadStream(4, wait, trigger=True, via=via)
    args = (fake(Int32, (dyn(),)), fake(Int32, (dyn(),)), Int32(1), fake_stream())
    lines = _sass(op, args, tmp_path / "sass")
    copy = "LDGSTS" if via == "cp.async" else "UBLKCP"
    landed = "DEPBAR.LE" if via == "cp.async" else "SYNCS.PHASECHK"
    copies = [n for n, line in enumerate(lines) if copy in line]
    first_wait = next(n for n, line in enumerate(lines) if landed in line)
    reads = [n for n, line in enumerate(lines) if "LDS.128" in line and n > first_wait]
    assert len(copies) == 4 and max(copies) < first_wait < min(reads)
    assert len([n for n in reads if n < first_wait + 20]) == 4  # the batch's 4 vectors back from shared memory
    waits = [n for n, line in enumerate(lines) if "ACQBULK" in line]
    assert (not waits) if wait == "none" else max(copies) < waits[0] < first_wait
    assert _registers(op, args, tmp_path / "res") <= 40


def _activations_paired_once(lines) -> bool:
    """The SASS pairs the fp16 activations where they are staged (a few byte permutes per staged vector), not once per
    weight word in the math (one PRMT per HFMA2): v17c / v19a, 14% of the one-token experts' instructions."""
    permutes = sum("PRMT" in line for line in lines)
    products = sum("HFMA2" in line for line in lines)
    return products > 0 and permutes <= products // 3


def _one_token_gemm2_args(d):
    e, lat, i, k = d.experts, d.latent, d.intermediate, d.top_k
    return (fake(Float16, (k, i)), fake(Uint8, (e, lat, i // 2)), fake(Uint8, (e, lat, i // 32)), *_plan(e),
            fake(Float32, (1, k)), fake(Float32, (lat,)), fake(Float32, (1, lat)), fake(BFloat16, (1, lat)),
            fake(Float32, (lat // ONE_TOKEN_ROWS,)), *(fake(Float32, (lat // ONE_TOKEN_ROWS,)),) * 3, fake_stream())


@pytest.mark.parametrize("tp", [8, 16])
def test_one_token_gemm2_holds_its_weights_across_the_wait_in_one_wave(tp, dims, tmp_path):
    """GEMM2's one-token form (v16): every weight load (and scale byte) of a thread before griddepcontrol.wait, the
    activations (written by GEMM1 while it runs) after it with plain loads, and its L/16 CTAs resident at once."""
    d = dims(tp)
    op = ExpertsGemm2OneToken(d.experts, d.latent, d.intermediate, d.top_k)
    lines = _sass(op, _one_token_gemm2_args(d), tmp_path / "sass")
    wait = next(n for n, line in enumerate(lines) if "ACQBULK" in line)
    weights = [n for n, line in enumerate(lines) if "LDG" in line and ".NA" in line]
    assert len(weights) == d.intermediate // 32 // 2 and max(weights) < wait  # half a row per lane
    scales = [n for n, line in enumerate(lines) if "LDG.E.U8" in line]
    assert max(scales) < wait and not _reads_before(lines, weights + scales, wait)  # v32b: the wait is not theirs
    after = [n for n, line in enumerate(lines) if "LDG.E.128" in line and n > wait]
    assert after and not any("CONSTANT" in lines[n] for n in after)
    # a in one L2 round trip: every 16-byte load of it before its first shared store. v18b's rewrite of this kernel
    # let ptxas interleave them (load, store, load, store) and the TP8 block took 3.6 us longer.
    stores = [n for n, line in enumerate(lines) if "STS.128" in line and n > wait]
    assert stores and max(after) < min(stores)
    assert _activations_paired_once(lines)
    registers = _registers(op, _one_token_gemm2_args(d), tmp_path / "res")
    assert op.ctas() <= 132 * (SM_REGISTERS // (registers * CTA_THREADS)), f"{registers} registers"


@pytest.mark.parametrize("shared_first", [False, True])
@pytest.mark.parametrize("tp", [8, 16])
def test_one_token_gemm2_with_the_shared_gate_up_keeps_its_wave_and_its_wait(tp, shared_first, dims, tmp_path):
    """The one-token GEMM2 with the shared experts' gate_up CTAs in its grid (v20a): still at most 64 registers (4
    CTAs per SM, as GEMM1: the gate_up's CTAs take the places GEMM1 frees), one wait, and every weight load (GEMM2's
    and the gate_up's) laid out before it. The gate_up's warps (split 4, v39a) each take 7 full 16-byte steps of
    their gate and up rows: 14 loads, where split 8 left the last of 4 steps half empty (8 loads)."""
    d = dims(tp)
    h, s = d.hidden, d.shared_intermediate
    op = ExpertsGemm2OneToken(d.experts, d.latent, d.intermediate, d.top_k, s, h, shared_first)
    args = (*_one_token_gemm2_args(d)[:-4], fake(BFloat16, (1, h)), fake(BFloat16, (2 * s, h)),
            fake(BFloat16, (1, s)), fake_stream())
    lines = _sass(op, args, tmp_path / "sass")
    wait = next(n for n, line in enumerate(lines) if "ACQBULK" in line)
    weights = [n for n, line in enumerate(lines) if "LDG" in line and ".NA" in line]
    assert sum("ACQBULK" in line for line in lines) == 1
    gemm2_loads = d.intermediate // 32 // 2  # a lane's w2 groups (ExpertsGemm2OneToken.groups)
    steps = h // 8 // ONE_TOKEN_SHARED_SPLIT // 32
    assert (ONE_TOKEN_SHARED_SPLIT, steps) == (4, 7)
    assert len(weights) == gemm2_loads + 2 * steps and max(weights) < wait  # GEMM2's and the gate_up's
    assert op.ctas() == d.latent // ONE_TOKEN_ROWS + s // 2
    assert _registers(op, args, tmp_path / "res") <= SM_REGISTERS // (4 * CTA_THREADS)


def _reads_before(lines: list[str], loads: list[int], stop: int) -> list[str]:
    """The instructions between each of the load lines `loads` and line `stop` that read a register it wrote (a
    128-bit load writes four: R12 stands for R12..R15)."""
    readers = []
    for n in loads:
        dest = int(re.search(r"LDG[.\w]* R(\d+),", lines[n]).group(1))
        written = set(range(dest, dest + (4 if ".128" in lines[n] else 1)))
        for line in lines[n + 1:stop]:
            body = _instruction(line)
            if "," in body and written & {int(r) for r in re.findall(r"\bR(\d+)\b", body.split(",", 1)[1])}:
                readers.append(body)
    return readers


def _held_gemm1_args(d):
    e, lat, i = d.experts, d.latent, d.intermediate
    return (fake(Float16, (dyn(), lat)), fake(Uint8, (e, 2 * i, lat // 2)), fake(Uint8, (e, 2 * i, lat // 32)),
            *_plan(e), fake(Float16, (dyn(), i)), fake(Float32, (dyn(), lat)), fake_stream())


@pytest.mark.parametrize("one_token", [True, False])
@pytest.mark.parametrize("tp", [8, 16])
def test_held_gemm1_has_every_load_in_flight_before_its_first_store(tp, one_token, dims, tmp_path):
    """GEMM1 holding its weights (v17): the plan's words in one round trip before the inactive slots exit, then
    each lane's weight vectors (L/512 of them) and scale bytes and the CTA's copy of x_lat all issued before the
    first shared-memory store, and none of the weights read before the barrier that follows the copy (v32a). One
    token: at most 64 registers (4 CTAs per SM: measured 10.6 us alone at TP8, against 11.4 at 5 per SM with 48
    registers and a 16-byte stack and 18.6 at 6); a batch's form, with its loop over a slot's further tokens: at most
    80 (3 per SM, as measured in v17e)."""
    d = dims(tp)
    op = ExpertsGemm1Held(d.experts, d.latent, d.intermediate, d.top_k, one_token)
    lines = _sass(op, _held_gemm1_args(d), tmp_path / "sass")
    first_exit = next(n for n, line in enumerate(lines) if "EXIT" in line and "PREEXIT" not in line)
    plan = [n for n, line in enumerate(lines) if re.search(r"LDG\.E R", line) and n < first_exit]
    assert len(plan) == (3 if one_token else 4), plan  # n_active, expert, pair (and the slot's count)
    first_store = next(n for n, line in enumerate(lines) if "STS" in line)
    weights = [n for n, line in enumerate(lines) if "LDG.E.NA.128" in line]
    scales = [n for n, line in enumerate(lines) if "LDG.E.U8" in line]
    x_copy = [n for n, line in enumerate(lines) if "LDG.E.128.CONSTANT" in line and n < first_store]
    assert len(weights) == len(scales) == d.latent // 512 and len(x_copy) == 2
    assert max(weights + scales + x_copy) < first_store
    assert _activations_paired_once(lines)
    # v32a: the copy and its barrier wait for x_lat only; no weight register is read before the barrier
    barrier = next(n for n, line in enumerate(lines) if "BAR.SYNC" in line)
    assert first_store < barrier and not _reads_before(lines, weights + scales, barrier)
    ctas_per_sm = ONE_TOKEN_CTAS_PER_SM if one_token else 3  # dispatch's shared_gate_up_first counts on the former
    assert _registers(op, _held_gemm1_args(d), tmp_path / "res") <= SM_REGISTERS // (ctas_per_sm * CTA_THREADS)


TRACE_ADDR = 1 << 20  # any nonzero address: the traced kernels are compiled, never launched, here


def _one_token_launches(d, trace_addr: int) -> dict:
    """The one-token block's four kernels as moe.decode_steps builds them (the TP8 forms), with their fake
    arguments."""
    h, s = d.hidden, d.shared_intermediate
    gemm2_args = (*_one_token_gemm2_args(d)[:-4], fake(BFloat16, (1, h)), fake(BFloat16, (2 * s, h)),
                  fake(BFloat16, (1, s)), fake_stream())
    front = FrontKernel(d.experts, h, d.latent, s, d.top_k, d.routed_scaling_factor, 1,
                        token_tile(1, tensor_cores=False), shared=False, trace_addr=trace_addr)
    return {
        "front": (front, _front_args(d)),
        "gemm1": (ExpertsGemm1Held(d.experts, d.latent, d.intermediate, d.top_k, True, trace_addr), _held_gemm1_args(d)),
        "gemm2": (ExpertsGemm2OneToken(d.experts, d.latent, d.intermediate, d.top_k, s, h, False, trace_addr),
                  gemm2_args),
        "finalize": (_streamed_finalize(d, trace_addr), _streamed_finalize_args(d)),
    }


@pytest.mark.parametrize("launch", ["front", "gemm1", "gemm2", "finalize"])
def test_a_traced_kernel_reads_the_timer_twice_and_keeps_its_ctas_per_sm(launch, dims, tmp_path):
    """kernels/trace.py: compiled with a record address, each one-token kernel reads %globaltimer and %clock64 at its
    start and after its last barrier, and it keeps as many CTAs per SM as without, by its registers and the launch's
    shared memory (a trace that changed occupancy would time another kernel; the traced one-token front needs fewer
    registers than the plain one, and shared memory holds both at 2 CTAs per SM); compiled without one, it has no
    probe at all."""
    d = dims(8)
    counts, ctas_per_sm = {}, {}
    for name, addr in (("plain", 0), ("traced", TRACE_ADDR)):
        op, args = _one_token_launches(d, addr)[launch]
        lines = _sass(op, args, tmp_path / name / "sass")
        counts[name] = (sum("SR_GLOBALTIMER" in line for line in lines), sum("SR_CLOCKLO" in line for line in lines))
        registers = -(-_registers(op, args, tmp_path / name / "res") // 8) * 8
        ctas_per_sm[name] = min(SM_REGISTERS // (registers * CTA_THREADS), SM_SHARED_BYTES // (op.smem_bytes() + 1024))
    assert counts == {"plain": (0, 0), "traced": (2, 2)}
    assert ctas_per_sm["traced"] == ctas_per_sm["plain"], ctas_per_sm


def _every_form(d) -> list[tuple[str, object, tuple]]:
    """Every kernel the block launches in some admitted (TP, M) form (kernels/dispatch.py), with fake arguments."""
    h, s = d.hidden, d.shared_intermediate
    gemm2_one_token_args = (*_one_token_gemm2_args(d)[:-4], fake(BFloat16, (1, h)), fake(BFloat16, (2 * s, h)),
                            fake(BFloat16, (1, s)), fake_stream())
    one_token_front = FrontKernel(d.experts, h, d.latent, s, d.top_k, d.routed_scaling_factor, 1, 1, shared=False)
    return [
        ("front M=1", one_token_front, _front_args(d)),
        ("front M=2..15", _front(d, 16), _front_args(d)),
        ("front M=16..64", _front(d, 64, router_mma=True), _front_args(d)),
        ("gemm1_held M=1", ExpertsGemm1Held(d.experts, d.latent, d.intermediate, d.top_k, True), _held_gemm1_args(d)),
        ("gemm1_held M=2..4", ExpertsGemm1Held(d.experts, d.latent, d.intermediate, d.top_k, False),
         _held_gemm1_args(d)),
        ("gemm1_mma", ExpertsGemm1SituMma(d.experts, d.latent, d.intermediate, d.top_k), _gemm1_args(d)),
        ("gemm2_one_token", ExpertsGemm2OneToken(d.experts, d.latent, d.intermediate, d.top_k, s, h, True),
         gemm2_one_token_args),
        ("gemm2_mma", ExpertsGemm2CombineMma(d.experts, d.latent, d.intermediate, d.top_k, d.eps), _gemm2_args(d)),
        ("finalize_streamed", _streamed_finalize(d), _streamed_finalize_args(d)),
        ("finalize_mma", Finalize(h, d.latent, s, 64), _finalize_args(d)),
    ]


@pytest.mark.parametrize("arch", ["sm_100a", "sm_103a"])
@pytest.mark.parametrize("tp", [8, 16])
def test_every_form_compiles_for_blackwell(arch, tp, dims, tmp_path):
    """Issue 37: every kernel builds for B200 (sm_100a) and GB300 (sm_103a) as it does for the H200, so that a port
    starts from code that compiles. Building is not evidence: the guard keeps rejecting sm_100/sm_103 until GPU tests
    and a perf matrix from that hardware exist (kimi_k3_path/README.md)."""
    for name, op, args in _every_form(dims(tp)):
        cubins = cubins_for(arch, op, args, tmp_path / name.replace(" ", "_").replace("=", "").replace(".", ""))
        assert len(cubins) == 1 and cubins[0].endswith(f".{arch}.cubin"), (name, cubins)
