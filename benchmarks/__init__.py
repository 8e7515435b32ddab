"""Benchmarks: the gatekeeper's own (bench_*.py, run as scripts) and the Kimi K3 path's (kimi_k3/, run as modules)."""
