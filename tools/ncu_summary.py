"""Summarizes an Nsight Compute text report (ncu's default output, as tools/gpu-profile.sh records it) into one row per
profiled launch: what the latency-bound launches of a decode step need to be told apart at a glance.

    python3 tools/ncu_summary.py <ncu report.txt>

Per launch: its short name (benchmarks/kimi_k3/timeline.short_name), grid and block, cluster size, registers, the
duration ncu measured, how long the SMs that had work were busy (SM Active Cycles is an average over all SMs: times
the SMs, over the SMs the grid could occupy, at the SM clock), the warp cycles per issued instruction, the active
warps per scheduler, DRAM throughput, and the three largest stall reasons where the report has the
smsp__average_warps_issue_stalled_*_per_issue_active.ratio metrics. ncu's own error lines (==ERROR==) are counted
and reported; a report with no launch in it exits 1.
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for the kernels' short names

from benchmarks.kimi_k3.timeline import short_name  # noqa: E402

LAUNCH = re.compile(r"^  (?P<name>\S.*?) \((?P<grid>\d+, \d+, \d+)\)x\((?P<block>\d+, \d+, \d+)\), Context \d+, "
                    r"Stream \d+, Device \d+, CC [\d.]+$")
# A metric row: name, optional unit, value; columns two or more spaces apart.
METRIC = re.compile(r"^    (?P<name>\S(?:.*?\S)?)(?: {2,}(?P<unit>\S+))? {2,}(?P<value>-?[\d,]+(?:\.\d+)?)$")
STALL = re.compile(r"^smsp__average_warps_issue_stalled_(?P<reason>\w+?)_per_issue_active\.ratio$")
TO_US = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


@dataclass
class Launch:
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    metrics: dict[str, tuple[str, float]] = field(default_factory=dict)  # name -> (unit, value)

    def value(self, name: str) -> float | None:
        return self.metrics[name][1] if name in self.metrics else None

    def duration_us(self) -> float | None:
        if "Duration" not in self.metrics:
            return None
        unit, value = self.metrics["Duration"]
        return value * TO_US[unit] if unit in TO_US else None

    def busy_us(self) -> float | None:
        """How long an SM that had work was busy: SM Active Cycles (ncu averages it over all SMs) times the SMs,
        over the SMs the grid could occupy, at the SM clock."""
        active, sms, ghz = self.value("SM Active Cycles"), self.value("# SMs"), self.value("SM Frequency")
        if None in (active, sms, ghz) or not ghz:
            return None
        ctas = self.grid[0] * self.grid[1] * self.grid[2]
        return active * sms / min(ctas, sms) / (ghz * 1e3)

    def stalls(self, top: int = 3) -> list[tuple[str, float]]:
        found = [(m["reason"], value) for name, (_, value) in self.metrics.items() if (m := STALL.match(name))]
        return sorted(found, key=lambda item: -item[1])[:top]


def parse(lines: list[str]) -> tuple[list[Launch], int]:
    """The launches of the report in order, and the number of ncu error lines."""
    launches, errors = [], 0
    for line in lines:
        line = line.rstrip("\n")
        if line.startswith("==ERROR=="):
            errors += 1
        elif match := LAUNCH.match(line):
            launches.append(Launch(match["name"], _dims(match["grid"]), _dims(match["block"])))
        elif launches and (match := METRIC.match(line)) and match["name"] != "Metric Name":
            launches[-1].metrics[match["name"]] = (match["unit"] or "", float(match["value"].replace(",", "")))
    return launches, errors


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(", "))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summarize(lines: list[str]) -> str:
    launches, errors = parse(lines)
    if not launches:
        raise ValueError(f"no profiled launch in the ncu report ({len(lines)} lines, {errors} ncu error lines)")
    rows = [f"{'launch':<44} {'grid':>12} {'block':>5} {'clu':>3} {'reg':>4} {'ncu us':>7} {'busy us':>7} "
            f"{'cyc/inst':>8} {'warps/sch':>9} {'dram %':>6}  top stalls (per issue)"]
    for launch in launches:
        grid = "x".join(str(v) for v in launch.grid)
        stalls = ", ".join(f"{reason} {value:.2f}" for reason, value in launch.stalls()) or "-"
        cluster = launch.value("Cluster Size")
        rows.append(
            f"{short_name(launch.name)[:44]:<44} {grid:>12} {launch.block[0]:>5} {_fmt(cluster, '.0f'):>3} "
            f"{_fmt(launch.value('Registers Per Thread'), '.0f'):>4} {_fmt(launch.duration_us(), '.2f'):>7} "
            f"{_fmt(launch.busy_us(), '.2f'):>7} {_fmt(launch.value('Warp Cycles Per Issued Instruction'), '.2f'):>8} "
            f"{_fmt(launch.value('Active Warps Per Scheduler'), '.2f'):>9} "
            f"{_fmt(launch.value('DRAM Throughput'), '.1f'):>6}  {stalls}")
    if errors:
        rows.append(f"ncu reported {errors} error line(s) (==ERROR==): see the report")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 tools/ncu_summary.py <ncu report.txt>", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        print(summarize(path.read_text(errors="replace").splitlines()))
    except (OSError, ValueError) as e:
        print(f"ncu_summary: {path}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
