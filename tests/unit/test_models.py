"""Tiny models: deterministic per seed, SGLang-readable config keys, loadable by HF transformers."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from sglang_radixflow.models import MAX_POSITIONS, make_model, spec_for


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "a": make_model("nemotron_h", root / "a", seed=3),
        "b": make_model("nemotron_h", root / "b", seed=3),
        "c": make_model("nemotron_h", root / "c", seed=4),
    }


def test_same_seed_same_weights_and_tokenizer(made: dict[str, Path]) -> None:
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert _digest(made["a"] / name) == _digest(made["b"] / name), name
    assert _digest(made["a"] / "model.safetensors") != _digest(made["c"] / "model.safetensors")


def test_config_carries_the_keys_sglang_reads(made: dict[str, Path]) -> None:
    config = json.loads((made["a"] / "config.json").read_text())
    assert config["layers_block_type"] == ["mamba", "mlp", "attention", "mlp"]
    assert config["mamba_n_groups"] == config["n_groups"] == 2
    assert config["max_position_embeddings"] == MAX_POSITIONS >= 8192 + 1024  # 8k prompts plus output
    from sglang.srt.configs.nemotron_h import NemotronHConfig

    sgl = NemotronHConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    assert sgl.layers_block_type == ["mamba", "mlp", "attention", "mlp"]
    assert sgl.mamba_n_groups == 2


def test_hf_transformers_loads_it_and_the_tokenizer_round_trips(made: dict[str, Path]) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(made["a"]))
    assert type(model).__name__ == "NemotronHForCausalLM"
    tok = transformers.AutoTokenizer.from_pretrained(str(made["a"]))
    text = "the quick tokenizer counts 12345 tokens, offline."
    assert tok.decode(tok.encode(text)) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)


def test_unknown_arch_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="unknown --arch 'mamba9'; allowed: nemotron_h, qwen3, qwen3_next"):
        spec_for("mamba9")


def test_qwen3_5_is_the_text_model_sglang_serves_with_its_gdn_layout(tmp_path: Path) -> None:
    """`--arch qwen3_5`: HF's Qwen3_5ForCausalLM (the text model; SGLang's qwen3_5_text.py serves it), three
    gated-delta-net layers then full attention, as SGLang's own config class reads the layout."""
    made = make_model("qwen3_5", tmp_path / "q", seed=0)
    config = json.loads((made / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["model_type"] == "qwen3_5_text"
    from sglang.srt.configs.qwen3_5 import Qwen3_5TextConfig

    sgl = Qwen3_5TextConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})
    assert sgl.layers_block_type == ["linear_attention"] * 3 + ["attention"]  # from full_attention_interval
    assert sgl.linear_layer_ids == [0, 1, 2] and sgl.full_attention_layer_ids == [3]
