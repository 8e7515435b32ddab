"""Per-rank Kimi K3 MoE shapes from the shipped config, and fresh random GPU inputs (seed printed for replay)."""

from __future__ import annotations

import os
import secrets

import pytest

from kimi_k3_path.config import named_config, shard_shapes


def moe_dims(tp: int):
    from kimi_k3_path.reference import MoeDims

    t = named_config("kimi_k3").text_config
    shards = shard_shapes(named_config("kimi_k3"), tp)
    return MoeDims(
        hidden=t.hidden_size, latent=t.routed_expert_hidden_size, experts=t.num_experts,
        top_k=t.num_experts_per_token, intermediate=shards.expert_intermediate,
        shared_intermediate=shards.shared_intermediate, routed_scaling_factor=t.routed_scaling_factor,
        eps=t.rms_norm_eps,
    )


@pytest.fixture
def dims():
    """dims(tp) -> the reference MoeDims of one rank at tensor-parallel size tp."""
    return moe_dims


@pytest.fixture
def seed(request) -> int:
    value = int(os.environ.get("KIMI_K3_TEST_SEED", secrets.randbits(31)))
    request.node.user_properties.append(("seed", value))
    print(f"seed {value} (replay with KIMI_K3_TEST_SEED={value})")
    return value
