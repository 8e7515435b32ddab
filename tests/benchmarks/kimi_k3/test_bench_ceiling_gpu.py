"""The read-only yardstick on the H200: every configuration reads every byte once (the CTAs' XOR words fold to the
buffer's), chained launches in each mode too, and a short bench run writes its rows."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (the [kernels] extra)")
pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (the [kernels] extra)")

from benchmarks.kimi_k3 import bench_ceiling  # noqa: E402
from benchmarks.kimi_k3.bench_ceiling import SEGMENTS, random_words, xor_reduce  # noqa: E402
from benchmarks.kimi_k3.stream import read_stream  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def gen(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


def test_xor_reduce_matches_the_host():
    words = torch.tensor([0x0F0F0F0F, 0x00FF00FF, -1, 7, 12345], dtype=torch.int32)
    want = 0
    for w in words.tolist():
        want ^= w
    assert xor_reduce(words.cuda()) == want


@pytest.mark.parametrize("via", ["registers", "cp.async", "bulk"])
@pytest.mark.parametrize("wait", ["none", "start", "held"])
@pytest.mark.parametrize("in_flight", [2, 8])
@pytest.mark.parametrize("words", [4, 4 * 1000, 4 * 132 * 256 * 8 * 3 + 4 * 77])  # tail only; batches plus a tail
def test_every_word_is_read_once(words, in_flight, wait, via, gen):
    (buf,) = random_words(words, 1, gen)
    ctas = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.full((ctas,), 0x5A5A5A5A, dtype=torch.int32, device="cuda")
    read_stream(buf, out, ctas, in_flight, torch.cuda.current_stream(), wait, trigger=True, via=via)
    torch.cuda.synchronize()
    assert xor_reduce(out) == xor_reduce(buf)
    buf[words // 2] ^= 1 << 9  # one flipped bit anywhere must show
    read_stream(buf, out, ctas, in_flight, torch.cuda.current_stream(), wait, trigger=True, via=via)
    torch.cuda.synchronize()
    assert xor_reduce(out) == xor_reduce(buf)


def test_bad_arguments_are_refused(gen):
    (buf,) = random_words(8, 1, gen)
    out = torch.zeros(4, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="multiple of 4 words"):
        read_stream(buf[:6], out, 4, 2, torch.cuda.current_stream())
    with pytest.raises(ValueError, match="at least 8 words"):
        read_stream(buf, out, 8, 2, torch.cuda.current_stream())


def test_a_short_bench_run_writes_single_and_chained_rows(tmp_path):
    segments = tmp_path / "kernels.json"
    sizes = [4_000_000, 1_000_000, 500_000, 3_000_000]
    segments.write_text(json.dumps([{"tp": 8, "batch": 1, "kernel": k, "weight_bytes": n}
                                    for k, n in zip(SEGMENTS, sizes)]))
    out = tmp_path / "ceiling.json"
    assert bench_ceiling.main(["--segments", str(segments), "--out", str(out), "--replays", "3"]) == 0
    result = json.loads(out.read_text())
    configs = (len(bench_ceiling.CTAS_PER_SM) + 1) * len(bench_ceiling.IN_FLIGHT)  # + one batch per CTA
    assert len(result["single"]) == len(sizes) * (configs + 1)  # + torch.sum per size
    assert {r["mode"] for r in result["chains"]} == set(bench_ceiling.CHAIN_MODES)
    # No read of a size beats the copy floor by much, and no chain its summed floor.
    assert all(r["median"] > 0.9 * r["floor_us"] for r in result["single"] + result["chains"])
