"""benchmarks/kimi_k3/floors.py: a layer's byte floor kept as its terms (what a perf row's note states), their sum,
and a step's floor as the sum of its layers'."""
from __future__ import annotations

from benchmarks.kimi_k3.floors import LayerBytes


def test_the_total_is_the_sum_of_the_terms_and_the_expert_count_is_not_a_byte_term():
    b = LayerBytes(weights=100, experts=40, active_experts=3, state=7, streams=5, activations=2)
    assert b.total == 154
    assert LayerBytes().total == 0


def test_a_steps_floor_adds_its_layers_term_by_term():
    kda = LayerBytes(weights=100, experts=40, active_experts=3, state=7, streams=5, activations=2)
    mla = LayerBytes(weights=90, experts=30, active_experts=2, state=11, streams=6, activations=2)
    step = sum((kda, mla), LayerBytes())
    assert step == LayerBytes(weights=190, experts=70, active_experts=5, state=18, streams=11, activations=4)
    assert step.total == kda.total + mla.total


def test_the_note_names_the_state_by_the_attention_and_leaves_out_what_a_block_does_not_move():
    b = LayerBytes(weights=100, experts=40, active_experts=3, state=7, streams=5, activations=2)
    assert b.describe("kda") == ("dense weights 100 + routed experts 40 (3 active) + KDA state read + written 7 + "
                                 "AttnRes streams 5 + MLP input and output 2")
    assert "MLA cache read + row written 7" in b.describe("mla")
    assert "state 7" in b.describe()
    moe = LayerBytes(weights=100, experts=40, active_experts=3, activations=2)
    assert moe.describe() == "dense weights 100 + routed experts 40 (3 active) + MLP input and output 2"
