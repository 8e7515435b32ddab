"""tools/gpu_state_summary.py: the one-line summary of the GPU's clocks, temperature, power and clock-event reasons
that tools/gpu-evidence.sh appends to a device run's bench.log."""
from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "gpu_state_summary.py"
spec = importlib.util.spec_from_file_location("gpu_state_summary", TOOL)
gpu_state_summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_state_summary)


def test_busy_clocks_peaks_and_reasons_other_than_idle_are_reported():
    log = [
        "2026/12/02 13:22:36.361, 345, 3201, 38, 78.37, 0x0000000000000001",
        "2026/12/02 13:22:36.861, 1980, 3201, 45, 305.20, 0x0000000000000000",
        "2026/12/02 13:22:37.361, 1755, 3201, 51, 699.90, 0x0000000000000004",
        "2026/12/02 13:22:37.861, 1980, 3201, 50, 400.10, 0x0000000000000000",
        "",
    ]
    assert gpu_state_summary.summarize(log) == (
        "gpu state: 4 samples, 3 busy; SM clock while busy 1755-1980 MHz (median 1980); memory clock 3201-3201 MHz; "
        "at most 51 C and 700 W; clock-event reasons: 0x4 (1x)")


def test_a_quiet_run_says_so():
    log = ["t, 1980, 3201, 40, 300.0, 0x0000000000000000", "t, 345, 3201, 38, 78.0, 0x0000000000000001"]
    assert gpu_state_summary.summarize(log).endswith("clock-event reasons: none besides idle")


def test_lines_that_are_not_samples_are_counted_not_dropped():
    error = 'Field "clocks_throttle_reasons.active" is not a valid field to query.'
    assert gpu_state_summary.summarize([error]) == "gpu state: no nvidia-smi samples (1 other lines)"
    mixed = gpu_state_summary.summarize([error, "t, 1980, 3201, 40, [N/A], 0x0", "t, 1980, 3201, 40, 300.0, 0x0"])
    assert mixed.startswith("gpu state: 1 samples, 1 busy") and mixed.endswith("; 2 lines were not samples")
