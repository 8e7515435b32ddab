"""GPU correctness of the MLA norms-and-row-insert launch (kernels/mla_norms.py) against torch's RMSNorm in fp32 of the
same bf16 inputs, at the per-rank qkv_a widths of TP8 and TP16: q_c and each token's cache row within 1e-2 relative
error per token (bf16 rounding of the output alone is ~2e-3), k_pe copied bit for bit, every other row of the page
pool untouched bit for bit, the rows at random slots of a shuffled pool. Outputs are poisoned with NaN; fresh random
inputs each run (seed printed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")

from kimi_k3_path.reference import rel_err  # noqa: E402

from test_compile_mla_norms import PAGE, op_and_args  # noqa: E402

TOL = 1e-2
PAGES = 40


def case(tp: int, m: int, gen: torch.Generator) -> dict:
    op, _ = op_and_args(tp)
    projected = (torch.randn(m, op.cols, generator=gen) * 3).bfloat16()
    return {
        "op": op, "projected": projected,
        "q_a_norm": (1 + 0.2 * torch.randn(op.q_lora, generator=gen)).bfloat16(),
        "kv_a_norm": (1 + 0.2 * torch.randn(op.kv_lora, generator=gen)).bfloat16(),
        "pages": torch.randn(PAGES, PAGE, op.row, generator=gen).bfloat16(),
        "slots": torch.randperm(PAGES * PAGE, generator=gen)[:m].to(torch.int64),
    }


def run(c: dict) -> tuple[torch.Tensor, torch.Tensor]:
    from kimi_k3_path.kernels.mla_norms import mla_norms_insert

    op = c["op"]
    pages = c["pages"].cuda()
    q_c = torch.full((c["projected"].shape[0], op.q_lora), float("nan"), dtype=torch.bfloat16, device="cuda")
    mla_norms_insert(c["projected"].cuda(), c["q_a_norm"].cuda(), c["kv_a_norm"].cuda(), op.eps, op.rope, pages,
                     c["slots"].cuda(), q_c, torch.cuda.current_stream())
    torch.cuda.synchronize()
    return q_c.cpu(), pages.cpu()


def expected(c: dict) -> tuple[torch.Tensor, torch.Tensor]:
    op, x = c["op"], c["projected"].float()
    q_end, kv_end = op.q_lora, op.q_lora + op.kv_lora
    q_c = torch.nn.functional.rms_norm(x[:, :q_end], (op.q_lora,), c["q_a_norm"].float(), op.eps)
    kv_c = torch.nn.functional.rms_norm(x[:, q_end:kv_end], (op.kv_lora,), c["kv_a_norm"].float(), op.eps)
    return q_c, torch.cat([kv_c, x[:, kv_end : kv_end + op.rope]], dim=1)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 64])
@pytest.mark.parametrize("tp", [8, 16])
def test_norms_and_rows_match_torch_and_nothing_else_moves(tp, m, seed):
    c = case(tp, m, torch.Generator().manual_seed(seed))
    q_c, pages = run(c)
    want_q, want_rows = expected(c)
    rows = pages.view(-1, c["op"].row)
    for t in range(m):
        assert rel_err(q_c[t], want_q[t]) < TOL, f"tp={tp} M={m} token {t}: q_c"
        assert rel_err(rows[c["slots"][t]], want_rows[t]) < TOL, f"tp={tp} M={m} token {t}: cache row"
    kv_lora = c["op"].kv_lora
    assert torch.equal(rows[c["slots"]][:, kv_lora:], c["projected"][:, c["op"].q_lora + kv_lora:][:, : c["op"].rope])
    others = torch.ones(rows.shape[0], dtype=torch.bool)
    others[c["slots"]] = False
    assert torch.equal(rows[others], c["pages"].view(-1, c["op"].row)[others])


@pytest.mark.gpu
def test_a_nan_stays_in_its_token(seed):
    c = case(8, 4, torch.Generator().manual_seed(seed))
    c["projected"][2, 5] = float("nan")  # q part of token 2
    c["projected"][2, c["op"].q_lora + 7] = float("inf")  # and its kv part
    q_c, pages = run(c)
    want_q, want_rows = expected(c)
    rows = pages.view(-1, c["op"].row)
    # A NaN makes its norm's sum NaN (the whole q_c row); an Inf makes it Inf, rsqrt 0, and Inf * 0 a NaN (as torch).
    assert torch.isnan(q_c[2]).all() and torch.isnan(rows[c["slots"][2], : c["op"].kv_lora]).any()
    for t in (0, 1, 3):
        assert rel_err(q_c[t], want_q[t]) < TOL and rel_err(rows[c["slots"][t]], want_rows[t]) < TOL
