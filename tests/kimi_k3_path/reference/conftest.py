"""Fresh random inputs on every run; the seed is printed with any failure so it can be replayed."""

from __future__ import annotations

import os
import secrets

import pytest
import torch

from kimi_k3_path.reference import KdaDims, MlaDims, MoeDims


@pytest.fixture
def gen(request) -> torch.Generator:
    seed = int(os.environ.get("KIMI_K3_TEST_SEED", secrets.randbits(31)))
    request.node.user_properties.append(("seed", seed))
    print(f"torch.Generator seed {seed} (replay with KIMI_K3_TEST_SEED={seed})")
    return torch.Generator().manual_seed(seed)


# Tiny dims of the same structure as K3 (the naive fp64 loops are slow): multiples of 32 where MXFP4 needs them.
@pytest.fixture
def kda_dims() -> KdaDims:
    return KdaDims(hidden=48, heads=2, head_dim=16)


@pytest.fixture
def mla_dims() -> MlaDims:
    return MlaDims(hidden=48, heads=3, q_lora=24, kv_lora=32, qk_nope=16, qk_rope=8, v_head=16)


@pytest.fixture
def moe_dims() -> MoeDims:
    return MoeDims(hidden=48, latent=64, experts=12, top_k=4, intermediate=32, shared_intermediate=40, routed_scaling_factor=2.5)
