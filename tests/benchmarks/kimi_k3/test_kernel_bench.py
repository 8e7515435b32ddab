"""What benchmarks/kimi_k3/kernel_bench.py gives every per-kernel bench built on it (bench_attn_res, bench_dense,
bench_mla), checked once for each: the shared arguments' refusals and the answer without a GPU. Each bench's own
arguments: its test_bench_*.py."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch", reason="the benches need the [kernels] extra")

BENCHES = ["bench_attn_res", "bench_dense", "bench_mla"]


def bench(name: str):
    try:  # bench_dense and bench_mla take their shapes and bytes from the kernel modules
        return importlib.import_module(f"benchmarks.kimi_k3.{name}")
    except ImportError as exc:
        pytest.skip(f"{name} does not import here ({exc}): the [kernels] extra")


@pytest.mark.parametrize("name", BENCHES)
@pytest.mark.parametrize("argv, message", [
    (["--tp", "4"], "the support matrix admits 8, 16"),
    (["--batch", "65"], "1..64 sequences"),
    (["--replays", "0"], "must be at least 1"),
])
def test_the_shared_arguments_refuse_what_the_support_matrix_does_not_admit(name, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench(name).parse_args([*argv, "--out", "x.json"])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without a GPU")
@pytest.mark.parametrize("name", BENCHES)
def test_without_a_gpu_the_bench_says_so_and_exits_2(name, capsys, tmp_path):
    assert bench(name).main(["--out", str(tmp_path / "x.json")]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
