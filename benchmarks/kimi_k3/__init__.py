"""Measurement-only code for the Kimi K3 path: the perf-matrix bench, the MoE block bench, the read-only ceiling,
and the stock-like baseline they measure against. Not part of the contribution: nothing in kimi_k3_path imports it."""
