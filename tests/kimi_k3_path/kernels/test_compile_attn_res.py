"""CPU checks of the AttnRes kernel (kernels/attn_res.py): it compiles for sm_90a at Kimi K3's hidden size for every
source count a layer has (0..8 completed blocks plus the prefix) and prefix mode, its SASS issues every stream load
before the first barrier, its host side rejects what it does not support, and its byte counts. Runs in CI."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")
torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

import cutlass.cute as cute  # noqa: E402

from kimi_k3_path.kernels.attn_res import (  # noqa: E402
    AttnResMix,
    Prefix,
    attn_res_bytes,
    attn_res_decode,
    fake_args,
)
from kimi_k3_path.reference.attn_res import MAX_SOURCES  # noqa: E402

from test_compile import _cubin_dump, cubins_for  # noqa: E402

HIDDEN = 7168
MAX_BLOCKS = MAX_SOURCES - 1


@pytest.mark.parametrize("blocks", range(MAX_BLOCKS + 1))
def test_compiles_for_every_source_count(blocks):
    for prefix in Prefix:
        op = AttnResMix(HIDDEN, blocks, prefix, -1, 1e-5, 1e-5)
        assert callable(cute.compile(op, *fake_args(HIDDEN, MAX_BLOCKS)))


def test_compiles_writing_a_block_and_at_a_hidden_size_that_leaves_threads_idle(tmp_path):
    """A block-writing site (layers 12, 24, ...), the tiny config's 256 columns, 200 columns (25 vectors on a warp of
    32 threads: 7 threads own nothing), 8200 (1025 vectors: 2 per thread on 544 threads, the last 63 threads' second
    one past the row); and for Blackwell, where a port starts from code that builds."""
    assert callable(cute.compile(AttnResMix(HIDDEN, 1, Prefix.ADD, 1, 1e-5, 1e-5), *fake_args(HIDDEN, MAX_BLOCKS)))
    assert callable(cute.compile(AttnResMix(256, 2, Prefix.REPLACE, -1, 1e-6, 1e-6), *fake_args(256, 4)))
    assert callable(cute.compile(AttnResMix(200, 1, Prefix.ADD, 2, 1e-6, 1e-6), *fake_args(200, 3)))
    wide = AttnResMix(8200, 3, Prefix.ADD, -1, 1e-6, 1e-6)
    assert (wide.per_thread, wide.threads) == (2, 544)
    assert callable(cute.compile(wide, *fake_args(8200, 4)))
    (cubin,) = cubins_for("sm_100a", AttnResMix(HIDDEN, 8, Prefix.ADD, -1, 1e-5, 1e-5), fake_args(HIDDEN, MAX_BLOCKS),
                          tmp_path / "sm100")
    assert cubin.endswith(".sm_100a.cubin")


def test_every_stream_load_is_issued_before_the_first_barrier(tmp_path):
    """What the design assumes (not yet measured): one thread per 16-byte vector at 7168 columns (896 threads, so at
    most 72 registers and no local memory beyond ptxas's stack), the 8 blocks, the prefix and the input loaded by
    13 LDG.128 (3 of them the weights), all before the first of the two CTA barriers, and the prefix and output
    stored once each."""
    op = AttnResMix(HIDDEN, 8, Prefix.ADD, -1, 1e-5, 1e-5)
    assert op.threads == 896 and op.per_thread == 1
    usage = _cubin_dump(op, fake_args(HIDDEN, MAX_BLOCKS), tmp_path / "res", "-res-usage")
    assert "LOCAL:0" in usage and int(re.search(r"REG:(\d+)", usage).group(1)) <= 72, usage
    sass = _cubin_dump(op, fake_args(HIDDEN, MAX_BLOCKS), tmp_path / "sass", "-sass").splitlines()
    loads = [n for n, line in enumerate(sass) if re.search(r"LDG\.E(\.CONSTANT)?\.128", line)]
    barriers = [n for n, line in enumerate(sass) if "BAR.SYNC" in line]
    assert len(loads) == 13 and len(barriers) == 2 and max(loads) < barriers[0], (loads, barriers)
    assert sum("STG.E.128" in line for line in sass) == 2


@pytest.mark.parametrize("cluster", [2, 4, 8])
def test_compiles_in_clusters_for_every_prefix_mode(cluster):
    for prefix in Prefix:
        op = AttnResMix(HIDDEN, 8, prefix, -1, 1e-5, 1e-5, cluster)
        assert callable(cute.compile(op, *fake_args(HIDDEN, MAX_BLOCKS)))
    assert callable(cute.compile(AttnResMix(256, 2, Prefix.REPLACE, 3, 1e-6, 1e-6, cluster), *fake_args(256, 4)))
    assert callable(cute.compile(AttnResMix(200, 1, Prefix.ADD, -1, 1e-6, 1e-6, 3), *fake_args(200, 3)))


def test_a_cluster_meets_once_off_the_chain_and_exchanges_its_sums_by_st_async(tmp_path):
    """CLUSTER CTAs per token, 224 threads each at 7168 columns: every stream load before the first CTA barrier (as in
    one CTA); one cluster barrier, its arrive before griddepcontrol.wait (ACQBULK) and its wait after the stream's
    loads are issued; the two row sums pushed to every CTA of the cluster by st.async (STAS, one per CTA a round),
    each round's mbarrier waited on (SYNCS...TRYWAIT) after its stores; no release fence (MEMBAR) anywhere, so the
    prefix is stored before the exchange starts."""
    from kimi_k3_path.kernels.attn_res import CLUSTER

    op = AttnResMix(HIDDEN, 8, Prefix.ADD, -1, 1e-5, 1e-5, CLUSTER)
    assert (CLUSTER, op.threads, op.per_thread) == (4, 224, 1)
    usage = _cubin_dump(op, fake_args(HIDDEN, MAX_BLOCKS), tmp_path / "res", "-res-usage")
    assert "LOCAL:0" in usage and "STACK:0" in usage, usage
    sass = _cubin_dump(op, fake_args(HIDDEN, MAX_BLOCKS), tmp_path / "sass", "-sass").splitlines()

    def at(pattern: str) -> list[int]:
        return [n for n, line in enumerate(sass) if re.search(pattern, line)]

    loads, barriers, stores = at(r"LDG\.E(\.CONSTANT)?\.128"), at("BAR.SYNC"), at(r"STG\.E\.128")
    (arrive,), (wait,), (acquire,) = at("UCGABAR_ARV"), at("UCGABAR_WAIT"), at("ACQBULK")
    pushes, polls = at("STAS"), at(r"SYNCS\.PHASECHK")
    assert len(loads) == 13 and max(loads) < barriers[0]
    assert arrive < acquire and max(loads) < wait < min(pushes)
    assert not at("MEMBAR") and len(stores) == 2 and stores[0] < min(pushes)
    assert len(pushes) == 2 * CLUSTER
    first, second = pushes[:CLUSTER], pushes[CLUSTER:]
    assert any(max(first) < p < min(second) for p in polls) and any(p > max(second) for p in polls)


def test_rejects_what_it_does_not_support():
    with pytest.raises(ValueError, match="multiple of 8"):
        AttnResMix(7170, 1, Prefix.ADD, -1, 1e-5, 1e-5)
    with pytest.raises(ValueError, match="at most 15"):
        AttnResMix(HIDDEN, 16, Prefix.ADD, -1, 1e-5, 1e-5)
    with pytest.raises(ValueError, match="one of the 3 blocks being mixed"):
        AttnResMix(HIDDEN, 3, Prefix.ADD, 1, 1e-5, 1e-5)
    with pytest.raises(ValueError, match="must be positive"):
        AttnResMix(HIDDEN, 3, Prefix.ADD, -1, 0.0, 1e-5)
    for cluster in (0, 9):
        with pytest.raises(ValueError, match=f"cluster={cluster} must be in 1..8"):
            AttnResMix(HIDDEN, 3, Prefix.ADD, -1, 1e-5, 1e-5, cluster)
    with pytest.raises(ValueError, match="at most the 2 vectors of a row"):
        AttnResMix(16, 1, Prefix.ADD, -1, 1e-5, 1e-5, 4)


def _args(m=1, hidden=256, max_blocks=4, dtype=torch.bfloat16):
    row = torch.zeros(m, hidden, dtype=dtype)
    vec = torch.zeros(hidden, dtype=dtype)
    return dict(prefix=row, delta=row.clone(), blocks=torch.zeros(m, max_blocks, hidden, dtype=dtype), res_norm=vec,
                res_proj=vec.clone(), out_norm=vec.clone(), out=row.clone())


def _call(num_blocks=2, write_block=-1, replace_prefix=False, **changes):
    a = {**_args(), **changes}
    attn_res_decode(a["prefix"], a["delta"], a["blocks"], num_blocks, write_block, a["res_norm"], a["res_proj"],
                    a["out_norm"], a["out"], 1e-5, 1e-5, None, replace_prefix)


def test_host_checks_name_the_bad_argument_before_any_launch():
    with pytest.raises(ValueError, match=r"decode batch M=65"):
        _call(**_args(m=65))
    with pytest.raises(ValueError, match="outside the 4 blocks"):
        _call(num_blocks=5)
    with pytest.raises(ValueError, match="replace_prefix needs delta"):
        _call(replace_prefix=True, delta=None)
    with pytest.raises(ValueError, match="out: expected dtype bfloat16"):
        _call(out=torch.zeros(1, 256))
    with pytest.raises(ValueError, match="res_proj: expected shape"):
        _call(res_proj=torch.zeros(128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # every shape right: the device is what is wrong
        _call()


def test_bytes_per_launch():
    """Layer 90's sites at one token: 8 blocks + the prefix + the input read, the prefix written, the output."""
    row = HIDDEN * 2
    assert attn_res_bytes(1, HIDDEN, 8, Prefix.ADD, False) == {
        "sources": 9 * row, "input": row, "writes": row, "weights": 3 * row, "output": row}
    assert attn_res_bytes(4, HIDDEN, 1, Prefix.REPLACE, True)["sources"] == 4 * row
    assert attn_res_bytes(4, HIDDEN, 1, Prefix.REPLACE, True)["writes"] == 8 * row
    assert attn_res_bytes(2, HIDDEN, 0, Prefix.KEEP, False)["input"] == 0
