"""tools/ncu_summary.py: one row per launch of an Nsight Compute text report (the launch header and metric rows as
ncu 2025.3 printed them for this repository's kernels on an H100, trimmed), the busy time of the SMs that had work,
stall reasons where the report has them, ncu's error lines reported, a report without launches refused; and
tools/gpu-profile.sh's ncu call (ncu and the device's environment stood in for)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("ncu_summary", ROOT / "tools" / "ncu_summary.py")
ncu_summary = importlib.util.module_from_spec(spec)
sys.modules["ncu_summary"] = ncu_summary  # its dataclass looks its module up there
spec.loader.exec_module(ncu_summary)

NAME = ("kernel_cutlass_kernel_kimi_k3_pathkernelskda_recurrentKdaRecurrent_object_at__tensorptrbf16_gmem_align16_o_"
        "628862881_tensorptrbf16_gmem_align16_o__0")
MIX = "kernel_cutlass_kernel_kimi_k3_pathkernelsattn_resAttnResMix_object_at__x"
REPORT = f"""==PROF== Connected to process 578 (/usr/bin/python3.12)
==PROF== Profiling "{NAME}": 0%....50%....100% - 18 passes
  {NAME} (12, 1, 1)x(256, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Warning: Data collection happened without fixed GPU frequencies. Profiling results may be inconsistent.
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Frequency                  Ghz         2.61
    SM Frequency                    Ghz         1.97
    Elapsed Cycles                cycle       16,374
    DRAM Throughput                   %         4.66
    Duration                         us         8.29
    SM Active Cycles              cycle     1,038.80
    ----------------------- ----------- ------------

    OPT   This kernel grid is too small to fill the available resources on this device, resulting in only 0.0 full
          waves across all SMs. Look at Launch Statistics for more details.

    Section: Scheduler Statistics
    Active Warps Per Scheduler          warp         2.00
    Section: Warp State Statistics
    Warp Cycles Per Issued Instruction             cycle        11.44
    Section: Launch Statistics
    Cluster Size                                                   0
    Registers Per Thread             register/thread             126
    # SMs                                         SM             132
  {MIX} (4, 2, 1)x(224, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    SM Frequency                    Ghz         2.00
    Duration                    msecond         0.01
    SM Active Cycles              cycle          500
    # SMs                                         SM             132
"""
# The stall metrics as --metrics prints them (name, no unit, value): the format of the rows above; not yet captured
# from a device run.
STALLS = """    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio                       0.40
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio               5.25
    smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio              1.10
    smsp__average_warps_issue_stalled_wait_per_issue_active.ratio                          0.90
"""


def test_one_row_per_launch_with_the_busy_time_of_the_sms_that_had_work():
    launches, errors = ncu_summary.parse(REPORT.splitlines())
    assert errors == 0 and [launch.grid for launch in launches] == [(12, 1, 1), (4, 2, 1)]
    kda, mix = launches
    assert kda.duration_us() == 8.29 and kda.value("Registers Per Thread") == 126
    # 1038.8 cycles on average over 132 SMs, 12 of them busy, at 1.97 GHz: 5.80 us each
    assert round(kda.busy_us(), 2) == 5.80
    assert mix.duration_us() == 10.0 and mix.busy_us() == 500 * 132 / 8 / 2000  # milliseconds converted; 8 CTAs
    lines = ncu_summary.summarize(REPORT.splitlines()).splitlines()
    assert len(lines) == 3 and lines[1].startswith("kda_recurrentKdaRecurrent")
    assert "8.29" in lines[1] and "5.80" in lines[1] and "11.44" in lines[1] and lines[1].endswith("-")
    assert lines[2].startswith("attn_resAttnResMix")


def test_the_largest_stall_reasons_come_first():
    text = REPORT.replace(f"  {MIX} (", STALLS + f"  {MIX} (", 1)  # the first launch's last rows
    kda, _ = ncu_summary.parse(text.splitlines())[0]
    assert kda.stalls() == [("long_scoreboard", 5.25), ("short_scoreboard", 1.10), ("wait", 0.90)]
    assert "long_scoreboard 5.25, short_scoreboard 1.10, wait 0.90" in ncu_summary.summarize(text.splitlines())


def test_ncu_errors_are_reported_and_an_empty_report_is_refused(tmp_path):
    text = REPORT + "==ERROR== Failed to profile kernel in process 578\n"
    summary = ncu_summary.summarize(text.splitlines())
    assert summary.endswith("ncu reported 1 error line(s) (==ERROR==): see the report")
    with pytest.raises(ValueError, match=r"no profiled launch in the ncu report \(2 lines, 1 ncu error lines\)"):
        ncu_summary.summarize(["==PROF== Connected", "==ERROR== LibraryNotLoaded"])
    empty = tmp_path / "ncu.txt"
    empty.write_text("")
    assert ncu_summary.main([str(empty)]) == 1 and ncu_summary.main([]) == 2


def test_gpu_profile_runs_ncu_on_the_layer_and_summarizes(tmp_path):
    """The script on the CPU: gpu-env.sh and ncu stood in for (ncu records its arguments and prints the report)."""
    work = tmp_path / "repo"
    (work / "tools").mkdir(parents=True)
    for name in ("gpu-profile.sh", "ncu_summary.py"):
        (work / "tools" / name).write_text((ROOT / "tools" / name).read_text())
    (work / "tools" / "gpu-env.sh").write_text(f"export PYTHONPATH={ROOT}\n")
    (work / "benchmarks").symlink_to(ROOT / "benchmarks")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    report = tmp_path / "report.txt"
    report.write_text(REPORT)
    (bin_dir / "ncu").write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/args\ncat {report}\n')
    (bin_dir / "ncu").chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "PATH": f"{bin_dir}:{os.environ['PATH']}", "LAYER": "mla_moe", "TP": "16",
           "KERNELS": "kda_recurrent|AttnResMix"}
    proc = subprocess.run(["bash", "tools/gpu-profile.sh"], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / "args").read_text()
    assert "--clock-control none" in args and "-k regex:kda_recurrent|AttnResMix --launch-count 6" in args
    assert "smsp__average_warps_issue_stalled_" in args
    assert "benchmarks.kimi_k3.bench --layer mla_moe --tp 16 --batch 1 --context 4096 --candidate kernels" in args
    assert "(1 launches profiled)" in proc.stdout
    assert (out / "ncu-summary.txt").read_text().splitlines()[1].startswith("kda_recurrentKdaRecurrent")
