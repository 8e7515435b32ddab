"""Where a step's time goes on its stream, from the start and end of each kernel (the torch profiler's, of one eager
call or one CUDA-graph replay).

A kernel's own duration over-charges it when launches overlap: with programmatic dependent launch a kernel starts
while the one before still runs and waits (griddepcontrol.wait), so its duration includes the wait, and the
per-name sums of `bench.py --breakdown` used to add up to more than the step. Here each kernel is charged its
share of the stream's span instead: the time from the later of its start and the latest end before it to its own
end (`exclusive`), and the idle time before it (`gap`: launch latency, host work). The shares and gaps of a step add
up to its span, first start to last end.

Pure: no torch (benchmarks/kimi_k3/stock.kernel_spans reads the profiler).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelSpan:
    name: str
    start_us: float
    end_us: float

    @property
    def elapsed_us(self) -> float:
        return self.end_us - self.start_us


@dataclass(frozen=True)
class PathShare:
    """One kernel's part of the step: its own duration, the span it adds after everything before it, and the idle
    time before it."""

    name: str
    elapsed_us: float
    exclusive_us: float
    gap_us: float


def critical_path(spans: list[KernelSpan]) -> list[PathShare]:
    """Each kernel's share of the stream's span, in start order (see the module docstring). A kernel that ends
    before one started earlier has ended is charged nothing."""
    shares = []
    latest_end = None
    for span in sorted(spans, key=lambda s: (s.start_us, s.end_us)):
        if span.end_us < span.start_us:
            raise ValueError(f"kernel {span.name}: ends ({span.end_us} us) before it starts ({span.start_us} us)")
        if latest_end is None:
            exclusive, gap = span.elapsed_us, 0.0
        else:
            exclusive = max(0.0, span.end_us - max(span.start_us, latest_end))
            gap = max(0.0, span.start_us - latest_end)
        shares.append(PathShare(span.name, span.elapsed_us, exclusive, gap))
        latest_end = span.end_us if latest_end is None else max(latest_end, span.end_us)
    return shares


# CuTe DSL names its kernels kernel_cutlass_<method>_<module path>_<Class>_object_at_<address>...: what tells the
# launches apart is the module, the class and (when not `kernel`) the method, which a truncated name cut off.
_CUTE_NAME = re.compile(r"^kernel_cutlass_(?P<method>\w+?)_kimi_k3_pathkernels(?P<where>\w+?)(?:_object_at_|$)")


def short_name(name: str) -> str:
    """A CuTe DSL kernel's name as <module><Class>[.<method>] (e.g. attn_resAttnResMix, mla_attentionMlaSplitKv
    .split_kernel); any other name as it is."""
    match = _CUTE_NAME.match(name)
    if match is None:
        return name
    method = match["method"]
    return match["where"] if method == "kernel" else f"{match['where']}.{method}"


def breakdown_lines(label: str, spans: list[KernelSpan], width: int = 70, how: str = "eager") -> list[str]:
    """The step's launches in order with their share, own duration and the gap before each, then the totals; `how`
    the spans were recorded ("eager" or "graph": bench.py --breakdown)."""
    shares = critical_path(spans)
    if not shares:
        return [f"breakdown {label}: no kernels"]
    span = max(s.end_us for s in spans) - min(s.start_us for s in spans)
    lines = [f"breakdown {label}: {len(shares)} kernels, {span:.1f} us from first start to last end ({how}): "
             f"{sum(s.exclusive_us for s in shares):.1f} us charged to kernels, {sum(s.gap_us for s in shares):.1f} "
             "us idle between them",
             f"    {'share us':>9} {'own us':>8} {'gap us':>7}  kernel (in launch order; share = its end after the "
             "latest end before it)"]
    for s in shares:
        lines.append(f"    {s.exclusive_us:9.1f} {s.elapsed_us:8.1f} {s.gap_us:7.1f}  {short_name(s.name)[:width]}")
    return lines
