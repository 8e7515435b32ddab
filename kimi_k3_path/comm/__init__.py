"""Tensor-parallel communication of the decode step over NVLink peer-to-peer memory (issue 40).

- `oneshot`: the one-shot all-reduce protocol of a layer's M x hidden bf16 partial sums: the symmetric buffer
  layout, the per-rank program as data, the exact rounding every rank applies (pure: numpy, no torch).
- `simulate`: a CPU executor of that program under adversarial interleavings, and the checker.
- `cost`: bytes and hops per rank and call, one-shot against a ring all-reduce.
- `kernel`: the CuTe DSL kernel that runs the program on sm_90a.

Nothing here is wired into the decode step yet: the support matrix admits no deployment on the strength of it.
"""
