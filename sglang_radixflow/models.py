"""Tiny random-initialised models (+ an offline-trained tokenizer) that SGLang 0.5.23 and HF transformers both load.

No model hub is reachable, so the tests and benchmarks make their own models. Architectures:
- `nemotron_h`  Mamba-2 + attention hybrid (layers: mamba, mlp, attention, mlp): the primary hybrid;
- `qwen3`       full attention only: the control;
- `qwen3_next`  gated delta net + attention + MoE (Qwen3-Next);
- `qwen3_5`     gated delta net + gated attention, dense MLP: the text model of Qwen3.5 (`Qwen3_5ForCausalLM`).
Everything is deterministic per seed (weights and tokenizer). Sizes fit a 2-core CPU; positions admit 8k-token prompts.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ARCHS: tuple[str, ...] = ("nemotron_h", "qwen3", "qwen3_next", "qwen3_5")
HYBRID_ARCHS: frozenset[str] = frozenset({"nemotron_h", "qwen3_next", "qwen3_5"})
VOCAB_SIZE = 2048
MAX_POSITIONS = 16384
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>")
MARKER_FILE = "radixflow_model.json"
# What a model directory holds; ensure_model remakes one written with an older format (2: the chat template).
MODEL_FORMAT = 2
# Role-tagged turns, each ended by EOS, so that SGLang's /v1/chat/completions (what agent frameworks call) answers.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    arch: str
    hf_config: dict[str, Any]  # passed to the transformers config class
    sglang_overrides: dict[str, Any]  # keys transformers 5.x writes differently from what SGLang 0.5.23 reads


def _nemotron_h() -> ModelSpec:
    blocks = ["mamba", "mlp", "attention", "mlp"]
    cfg = dict(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, layers_block_type=blocks,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=MAX_POSITIONS,
        mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=16, conv_kernel=4, expand=2,
        chunk_size=64, mlp_hidden_act="relu2", tie_word_embeddings=False,
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
    )
    # transformers writes layers_block_type as linear_attention/full_attention and the group count as n_groups;
    # SGLang's configs/nemotron_h.py wants mamba/attention/mlp and mamba_n_groups (default 8 -> split-size error).
    return ModelSpec("nemotron_h", cfg, {"layers_block_type": blocks, "mamba_n_groups": 2, "mamba_chunk_size": 64})


def _qwen3() -> ModelSpec:
    cfg = dict(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
    )
    return ModelSpec("qwen3", cfg, {})


def _gdn_hybrid(**extra: Any) -> dict[str, Any]:
    """Qwen3-Next / Qwen3.5 layout: three gated-delta-net layers, then full attention."""
    return dict(
        vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=MAX_POSITIONS,
        linear_conv_kernel_dim=4, linear_key_head_dim=32, linear_value_head_dim=32,
        linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        tie_word_embeddings=False, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, **extra,
    )


def _qwen3_next() -> ModelSpec:
    cfg = _gdn_hybrid(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
    )
    # SGLang's configs/qwen3_next.py derives the layer layout from full_attention_interval, which transformers omits.
    return ModelSpec("qwen3_next", cfg, {"full_attention_interval": 4})


def _qwen3_5() -> ModelSpec:
    # Qwen3.5 checkpoints ship the multimodal wrapper; its text model is what serves text, so that is what we make.
    # Its SGLang config class derives the layout from full_attention_interval too.
    return ModelSpec("qwen3_5", _gdn_hybrid(), {"full_attention_interval": 4})


SPECS: dict[str, Callable[[], ModelSpec]] = {
    "nemotron_h": _nemotron_h, "qwen3": _qwen3, "qwen3_next": _qwen3_next, "qwen3_5": _qwen3_5,
}


def spec_for(arch: str) -> ModelSpec:
    if arch not in SPECS:
        raise ValueError(f"unknown --arch {arch!r}; allowed: {', '.join(ARCHS)}")
    return SPECS[arch]()


def _corpus(seed: int, n_lines: int = 4000) -> list[str]:
    """Deterministic pseudo-language text: syllable words, so BPE learns merges at several lengths."""
    rng = random.Random(seed)
    onsets = ["", "b", "d", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "st", "tr", "pl", "sh", "ch"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "s", "t", "r", "l", "nd", "st"]
    lexicon = [
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(rng.randint(1, 3)))
        for _ in range(3000)
    ]
    punct = [".", ",", "?", "!", ":", ";"]
    lines = []
    for _ in range(n_lines):
        words = [rng.choice(lexicon) for _ in range(rng.randint(4, 20))]
        lines.append(" ".join(words) + rng.choice(punct) + " " + str(rng.randint(0, 999)))
    return lines


def train_tokenizer(out: Path, seed: int) -> None:
    """Byte-level BPE (every byte string encodes; no <unk>) saved as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID]
    assert tok.get_vocab_size() <= VOCAB_SIZE, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def make_model(arch: str, out: str | Path, seed: int = 0) -> Path:
    """Write a random-initialised `arch` model (bf16 safetensors + tokenizer) to `out`; returns the directory."""
    import torch
    import transformers

    spec = spec_for(arch)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config_cls = {
        "nemotron_h": transformers.NemotronHConfig,
        "qwen3": transformers.Qwen3Config,
        "qwen3_next": transformers.Qwen3NextConfig,
        "qwen3_5": transformers.Qwen3_5TextConfig,
    }[arch]
    config = config_cls(**spec.hf_config)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(str(out), safe_serialization=True)
    train_tokenizer(out, seed)

    config_path = out / "config.json"
    written = json.loads(config_path.read_text())
    written.update(spec.sglang_overrides)
    config_path.write_text(json.dumps(written, indent=2, sort_keys=True) + "\n")
    (out / MARKER_FILE).write_text(json.dumps({"arch": arch, "seed": seed, "format": MODEL_FORMAT}) + "\n")
    return out


def model_arch(model_dir: str | Path) -> str:
    """The arch of a model made by make_model (reads its marker file)."""
    marker = Path(model_dir) / MARKER_FILE
    if not marker.is_file():
        raise FileNotFoundError(f"{model_dir} is not a model made by `radixflow make-model` (no {MARKER_FILE})")
    return json.loads(marker.read_text())["arch"]


# config.json model_type of the hybrid families SGLang 0.5.23 serves with a recurrent state (configs/hybrid_arch.py):
# their servers on a CPU get the mamba strategy flags and a bounded state pool.
HYBRID_MODEL_TYPES: frozenset[str] = frozenset({
    "nemotron_h", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "falcon_h1", "lfm2",
    "lfm2_moe", "mamba", "mamba2", "falcon_mamba", "kimi_linear", "bailing_hybrid", "jet_nemotron", "zaya",
    "granitemoehybrid",
})


def read_model_config(model_dir: str | Path) -> dict[str, Any]:
    """config.json of a local model directory (a tiny model or the user's own); FileNotFoundError names the path."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{model_dir}: no config.json (expected a local Hugging Face model directory)")
    return json.loads(path.read_text())


def is_hybrid_model(model_dir: str | Path) -> bool:
    """Whether a model directory holds a hybrid (recurrent-state) model: a tiny model's arch, else its model_type
    (or its text model's, for the multimodal wrappers)."""
    marker = Path(model_dir) / MARKER_FILE
    if marker.is_file():
        return model_arch(model_dir) in HYBRID_ARCHS
    config = read_model_config(model_dir)
    types = {config.get("model_type"), (config.get("text_config") or {}).get("model_type")}
    return bool(types & HYBRID_MODEL_TYPES)


def model_vocab_size(model_dir: str | Path) -> int:
    config = read_model_config(model_dir)
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"{model_dir}/config.json: no vocab_size (the workloads draw token ids below it)")
    return size


def ensure_model(arch: str, root: str | Path, seed: int = 0) -> Path:
    """root/<arch>-s<seed>, made if missing or of an older format (used by demo, bench and tests)."""
    target = Path(root) / f"{arch}-s{seed}"
    marker = target / MARKER_FILE
    if marker.is_file() and json.loads(marker.read_text()).get("format", 1) == MODEL_FORMAT:
        return target
    return make_model(arch, target, seed)
