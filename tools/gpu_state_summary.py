"""Summarizes an nvidia-smi log of one device run, as tools/gpu-evidence.sh records it:
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active
               --format=csv,noheader,nounits -lms 500
into one line for bench.log: the SM clock while busy (samples above BUSY_MHZ), the memory clock, the hottest and most
power-hungry sample, and every clock-event reason seen besides none (0x0) and idle (0x1). Lines that are not samples
(an nvidia-smi error) are counted and reported, never dropped silently.

    python3 tools/gpu_state_summary.py <log>
"""
from __future__ import annotations

import statistics
import sys
from collections import Counter

BUSY_MHZ = 1000
QUIET_REASONS = {0x0, 0x1}  # none; GPU idle


def summarize(lines: list[str]) -> str:
    samples, other = [], 0
    for line in lines:
        if not line.strip():
            continue
        try:
            _, sm, mem, temp, power, reasons = (f.strip() for f in line.split(","))
            samples.append((int(sm), int(mem), float(temp), float(power), int(reasons, 16)))
        except ValueError:
            other += 1
    if not samples:
        return f"gpu state: no nvidia-smi samples ({other} other lines)"
    busy = [s[0] for s in samples if s[0] > BUSY_MHZ]
    clock = (f"SM clock while busy {min(busy)}-{max(busy)} MHz (median {statistics.median(busy):.0f})" if busy
             else f"SM clock never above {BUSY_MHZ} MHz")
    mems = [s[1] for s in samples]
    reasons = Counter(f"0x{s[4]:x}" for s in samples if s[4] not in QUIET_REASONS)
    seen = (", ".join(f"{r} ({n}x)" for r, n in sorted(reasons.items())) if reasons
            else "none besides idle")
    text = (f"gpu state: {len(samples)} samples, {len(busy)} busy; {clock}; memory clock {min(mems)}-{max(mems)} MHz; "
            f"at most {max(s[2] for s in samples):.0f} C and {max(s[3] for s in samples):.0f} W; clock-event "
            f"reasons: {seen}")
    return text + (f"; {other} lines were not samples" if other else "")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 tools/gpu_state_summary.py <nvidia-smi log>")
    with open(sys.argv[1]) as log:
        print(summarize(log.read().splitlines()))
