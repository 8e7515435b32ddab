from __future__ import annotations

import json
from collections import Counter

import pytest

from kimi_k3_path.config import (
    CONFIG_DIR,
    ConfigError,
    KimiK3Config,
    Projection,
    load_config,
    named_config,
    parse_config,
    shard_shapes,
)


@pytest.fixture(scope="module")
def real() -> KimiK3Config:
    return named_config("kimi_k3")


@pytest.fixture()
def raw() -> dict:
    return json.loads((CONFIG_DIR / "kimi_k3.json").read_text())


def test_the_real_config_has_the_published_dimensions(real):
    t = real.text_config
    assert (t.hidden_size, t.num_hidden_layers, t.rms_norm_eps) == (7168, 93, 1e-5)
    assert (t.linear_attn_config.num_heads, t.linear_attn_config.head_dim) == (96, 128)
    assert (t.linear_attn_config.short_conv_kernel_size, t.linear_attn_config.gate_lower_bound) == (4, -5.0)
    assert (t.num_attention_heads, t.q_lora_rank, t.kv_lora_rank) == (96, 1536, 512)
    assert t.kv_lora_rank + t.qk_rope_head_dim == 576  # the latent cache row
    assert (t.num_experts, t.num_experts_per_token, t.routed_expert_hidden_size) == (896, 16, 3584)
    assert (t.moe_intermediate_size, t.num_shared_experts, t.intermediate_size) == (3072, 2, 33792)
    assert (t.activation_situ_beta, t.activation_situ_linear_beta, t.routed_scaling_factor) == (4.0, 25.0, 1.0)
    assert t.attn_res_block_size == 12
    assert t.expert_quant == "mxfp4"


def test_the_layer_schedule(real):
    kinds = real.layer_kinds()
    assert Counter(real.attention_kind(i) for i in range(93)) == {"kda": 69, "mla": 24}
    # MLA at 1-based layers 4, 8, ..., 92 and 93; a dense MLP in layer 0 only.
    assert [i + 1 for i in range(93) if real.attention_kind(i) == "mla"] == [*range(4, 93, 4), 93]
    assert kinds[0] == "kda_dense" and kinds[1] == "kda_moe" and kinds[3] == "mla_moe" and kinds[92] == "mla_moe"
    assert Counter(kinds) == {"kda_dense": 1, "kda_moe": 68, "mla_moe": 24}
    with pytest.raises(IndexError, match="layer 93 is outside 0..92"):
        real.attention_kind(93)


def test_tiny_has_the_same_structure_with_small_dimensions(real):
    tiny = named_config("tiny")
    assert set(tiny.layer_kinds()) == set(real.layer_kinds())
    assert tiny.text_config.hidden_size < 1024 and tiny.text_config.num_experts < 64
    for tp in (1, 2, 8, 16):
        assert tiny.shard_shapes(tp).kda_heads >= 1


def test_published_per_rank_shapes_at_tp8_and_tp16(real):
    tp8, tp16 = real.shard_shapes(8), shard_shapes(real, 16)
    assert (tp8.kda_heads, tp8.mla_heads, tp8.expert_intermediate) == (12, 12, 384)
    assert (tp16.kda_heads, tp16.mla_heads, tp16.expert_intermediate) == (6, 6, 192)
    # Stock vLLM pads TP16's 192 to 256; TP8's 384 is left alone.
    assert (tp8.expert_intermediate_stock, tp16.expert_intermediate_stock) == (384, 256)
    assert (tp8.shared_intermediate, tp16.shared_intermediate) == (768, 384)
    assert tp8.dense_intermediate == 33792 // 8


def test_projection_shapes_at_tp8(real):
    p = real.shard_shapes(8).projections
    assert p["kda.q_proj"] == Projection(1536, 7168, "column")
    assert p["kda.f_a_proj"] == Projection(128, 7168, "replicated")
    assert p["kda.f_b_proj"] == Projection(1536, 128, "column")
    assert p["kda.b_proj"] == Projection(12, 7168, "column")
    assert p["kda.o_proj"] == Projection(7168, 1536, "row")
    assert p["mla.q_a_proj"] == Projection(1536, 7168, "replicated")
    assert p["mla.kv_a_proj"] == Projection(576, 7168, "replicated")
    assert p["mla.q_b_proj"] == Projection(12 * 192, 1536, "column")
    assert p["mla.kv_b_proj"] == Projection(12 * 256, 512, "column")
    assert p["mla.o_proj"] == Projection(7168, 1536, "row")
    assert p["moe.gate"] == Projection(896, 7168, "replicated")
    assert p["moe.down_proj"] == Projection(3584, 7168, "replicated")
    assert p["moe.expert_w13"] == Projection(768, 3584, "column")
    assert p["moe.expert_w2"] == Projection(3584, 384, "row")
    assert p["moe.up_proj"] == Projection(7168, 3584, "replicated")
    assert p["moe.shared_gate_up_proj"] == Projection(1536, 7168, "column")
    assert p["moe.shared_down_proj"] == Projection(7168, 768, "row")


@pytest.mark.parametrize("tp", [1, 2, 8, 16])
def test_shards_reassemble_the_full_weights(real, tp):
    full, shard = real.shard_shapes(1).projections, real.shard_shapes(tp).projections
    assert full.keys() == shard.keys()
    for name, p in shard.items():
        whole = full[name]
        assert p.split == whole.split, name
        if p.split == "column":
            assert (p.n * tp, p.k) == (whole.n, whole.k), name
        elif p.split == "row":
            assert (p.n, p.k * tp) == (whole.n, whole.k), name
        else:
            assert p == whole, name


def test_shapes_that_do_not_divide_are_refused(real, raw):
    with pytest.raises(ValueError, match="linear_attn_config.num_heads=96 is not divisible by tp=5"):
        real.shard_shapes(5)
    with pytest.raises(ValueError, match="tp must be >= 1"):
        real.shard_shapes(0)
    # 1600 / 8 = 200 divides, but would split a 32-element MXFP4 block between ranks.
    raw["text_config"]["moe_intermediate_size"] = 1600
    with pytest.raises(ValueError, match="moe_intermediate_size/tp=200 is not a multiple of the MXFP4 block 32"):
        parse_config(raw).shard_shapes(8)


def test_a_missing_field_is_named_with_its_line(raw, tmp_path):
    del raw["text_config"]["num_experts"]
    raw["text_config"]["hidden_act"] = "silu"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw, indent=2))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    fields = [field for field, _, _ in caught.value.problems]
    assert fields == ["text_config.hidden_act", "text_config.num_experts"]
    message = str(caught.value)
    act_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if '"hidden_act"' in line)
    assert f"{path}:{act_line}: text_config.hidden_act: Input should be 'situ', got 'silu'" in message
    assert "text_config.num_experts: Field required" in message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(model_type="kimi_k2"), "model_type: Input should be 'kimi_k3'"),
        (lambda c: c["text_config"].update(num_expert_group=8), "text_config.num_expert_group: Input should be 1"),
        (lambda c: c["text_config"].update(mla_use_nope=False), "text_config.mla_use_nope"),
        (lambda c: c["text_config"].update(num_experts_per_token=900), "exceeds num_experts=896"),
        (lambda c: c["text_config"]["linear_attn_config"]["kda_layers"].append(4), "[4] are both KDA and full"),
        (lambda c: c["text_config"]["linear_attn_config"]["kda_layers"].remove(1), "missing [1]"),
        (lambda c: c["text_config"]["linear_attn_config"].update(gate_lower_bound=0.5), "gate_lower_bound"),
        (lambda c: c["text_config"].update(hidden_size="big"), "text_config.hidden_size"),
        (lambda c: c.pop("text_config"), "text_config: Field required"),
    ],
)
def test_bad_configs_name_the_field(raw, edit, message):
    edit(raw)
    with pytest.raises(ConfigError) as caught:
        parse_config(raw, "cfg.json")
    assert message in str(caught.value)
    assert str(caught.value).startswith("cfg.json")


def test_routed_scaling_factor_defaults_to_one(raw):
    del raw["text_config"]["routed_scaling_factor"]
    assert parse_config(raw).text_config.routed_scaling_factor == 1.0


def test_unquantized_experts_are_reported_as_such(raw):
    del raw["text_config"]["quantization_config"]
    assert parse_config(raw).text_config.expert_quant == "bfloat16"


def test_unreadable_and_malformed_files_give_file_and_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "model_type": "kimi_k3",\n  "text_config": {,\n}\n')
    with pytest.raises(ConfigError, match=rf"{bad}:3: <json>: Expecting property name"):
        load_config(bad)
    with pytest.raises(ConfigError, match="expected a JSON object, got list"):
        parse_config([1, 2])
    with pytest.raises(ValueError, match="no shipped config 'huge'; shipped: kimi_k3, tiny"):
        named_config("huge")
