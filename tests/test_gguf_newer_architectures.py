"""GGUF of the families whose llama.cpp architecture PyPI's gguf-py (0.19) lacks, written with llama.cpp's own gguf-py:
the one llama-cpp-python's source package vendors beside the converter, put before PyPI's as a user's
`pip install <llama.cpp>/gguf-py` would. Each file is the converter's (which reads the same gguf-py) and
llama-quantize's; llama.cpp, compiled from the same source, computes transformers' logits from it. With PyPI's
gguf-py, one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import generate
import gguf
import numpy as np
import pytest
import torch
from conftest import SHIPPED
from make_fsdp import MINIMAX_ZERO_ROWS
from safetensors.torch import load_file, save_file
from test_gguf import (  # noqa: F401  (converter, llama_cpp and ggml_library: the fixtures, used by name)
    LLAMA_CPP_TOLERANCE,
    assert_same_file,
    contents,
    converter,
    for_the_converter,
    ggml_library,
    llama_cpp,
    llama_cpp_client,
)
from test_gguf_mmproj import AUDIO_TOLERANCE, IMAGE_TOLERANCE, assert_same_tensors

import unshard
from unshard.errors import ConfigMismatchError
from unshard.sinks.gguf import kquants

# (the suite's byte-level BPE, trained for the fixtures: the Muse Glimmer fixture ships a config alone)


def unshard_with_llama_cpp_gguf_py(*args, **env) -> subprocess.CompletedProcess:
    """unshard's command line in an interpreter that finds llama.cpp's own gguf-py before PyPI's."""
    return unshard_commands_with_llama_cpp_gguf_py([args], **env)


# unshard's commands one after another in one interpreter, to the first that fails: each in a process of its own would
# import torch and transformers again (5 s of a core)
ONE_AFTER_ANOTHER = """
import json, sys
from unshard.cli import main
for argv in json.loads(sys.argv[1]):
    if code := main(argv):
        sys.exit(code)
"""


def unshard_commands_with_llama_cpp_gguf_py(commands: list[tuple], **env) -> subprocess.CompletedProcess:
    """unshard's command lines, one after another in an interpreter that finds llama.cpp's own gguf-py before PyPI's:
    the first failure's code, every command's messages."""
    gguf_py = generate.llama_cpp_source() / "gguf-py"
    return subprocess.run(
        [sys.executable, "-c", ONE_AFTER_ANOTHER, json.dumps([list(map(str, args)) for args in commands])],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(
            os.environ, PYTHONPATH=os.pathsep.join(filter(None, (str(gguf_py), os.environ.get("PYTHONPATH")))), **env
        ),
    )


def folder_of_the_reference(case: str, tmp_path: Path) -> tuple[Path, Path]:
    """unshard's folder of a fixture's rank files (tmp_path/hf), asserted to be the fixture's reference model tensor
    for tensor: (the rank files, the folder)."""
    src, folder = SHIPPED / case / "global_step_1", tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    written = load_file(folder / "model.safetensors")
    reference = load_file(SHIPPED / case / "reference" / "model.safetensors")
    assert sorted(written) == sorted(reference) and all(torch.equal(written[n], t) for n, t in reference.items())
    return src, folder


def unshard_files(src: Path, tmp_path: Path, kinds: tuple[str, ...], library: str, *more) -> str:
    """unshard's GGUF file of the checkpoint in each type (tmp_path/KIND.gguf), with llama.cpp's own gguf-py and the
    ggml library llama-quantize's K-quants are computed with: the conversions' messages."""
    commands = [
        ("convert", src, tmp_path / f"{kind}.gguf", *more, "--gguf-type", kind, "--no-progress") for kind in kinds
    ]
    done = unshard_commands_with_llama_cpp_gguf_py(commands, **{kquants.LIBRARY_VARIABLE: library})
    assert done.returncode == 0, done.stderr
    return done.stderr


# The FSDP2 fixtures of those families, by llama.cpp's architecture
NEWER = {
    "graniteswa-fsdp2": "granite_swa",
    "granitemoeswa-fsdp2": "granite_swa",
    "mellum-fsdp2": "mellum",
    "cohere2moe-fsdp2": "cohere2moe",
    "deepseekv32-fsdp2": "deepseek32",
    "hyv3-fsdp2": "hy_v3",
    "laguna-fsdp2": "laguna",
    "lagunam1-fsdp2": "laguna",
    "hrmtext-fsdp2": "hrm_text",
    "minimaxm3-fsdp2": "minimax-m3",
    "step3p7-fsdp2": "step35",
    "qwen4exp-fsdp2": "qwen4exp",
    "glm5next-fsdp2": "glm5-next",
    "minimax01-fsdp2": "minimax-01",
    "ling3-fsdp2": "bailingmoe3",
}
# The vision-language models among them (their text model written), and those llama.cpp runs with flash attention on
# (MiniMax-M3's sparse attention: without it, llama.cpp's every query attends to every key)
NEWER_VISION = ("minimaxm3-fsdp2", "step3p7-fsdp2", "glm5next-fsdp2")
FLASH_ATTENTION = ("minimaxm3-fsdp2",)
# The queries compared with transformers, by fixture (all where none): Qwen4-Exp's within QSA's budget of 8 tokens and
# a block of 4, and past it those that see 3 tokens after their last complete block; llama.cpp's selection for the
# others differs (a note says so)
COMPARED_ROWS = {"qwen4exp-fsdp2": lambda n: [i for i in range(n) if i < 8 + 4 - 1 or (i + 1) % 4 == 3]}
# The prompt's length where the window's does not say it: past MiniMax-01's blocks of 16 tokens, which transformers'
# lightning attention carries its state across
PROMPT_LENGTHS = {"minimax01-fsdp2": 40}
# Those whose tensors llama-quantize chooses types for by their architecture (GLM-5-Next's: some left as the
# converter's f32 file has them, some no lower than Q8_0), compared in a legacy type too
LEGACY_TOO = ("glm5next-fsdp2",)
# What a release's folder says that transformers' save does not, by fixture and file: DeepSeek-V3.2's tokenizer adds
# its start token
AS_RELEASED = {"deepseekv32-fsdp2": {"tokenizer_config.json": {"add_bos_token": True}}}
# Added tokens a release's tokenizer has that the suite's lacks, by fixture: Laguna's end of turn, which its tokenizer
# does not call special and the converter lists as a control token all the same
ADDED_TOKENS = {"laguna-fsdp2": "</assistant>"}
# (dots3-note's as the Hub's names it: the sliding layers' latent attention as swa_ keys, the window, rope's bases by
# kind of layer, the dense layers, the router, the rescaled latents; transformers 5 saves them otherwise)
DOTS3_ON_THE_HUB = {
    "swa_num_attention_heads": 8,
    "swa_q_lora_rank": 48,
    "swa_kv_lora_rank": 24,
    "swa_qk_nope_head_dim": 16,
    "swa_qk_rope_head_dim": 8,
    "swa_v_head_dim": 16,
    "swa_head_dim": 24,
    "sliding_window_size": 4,
    "rope_parameters": None,
    "rope_theta": 8e7,
    "swa_rope_theta": 5e4,
    "first_k_dense_replace": 1,
    "scoring_func": "sigmoid",
    "apply_mla_qkv_lora_rescale": True,
}
# What the converter (with transformers 4) reads otherwise, by fixture and file: DeepSeek-V3.2's routing as the Hub's
# config names it (transformers 5 routes by sigmoid and saves no word of it; unshard writes it, as llama.cpp's
# deepseek32 needs), and the tokenizer's class by which transformers 4 reads add_bos_token
LAYER_KINDS = ("full_attention", "linear_attention", "mlp")  # (MiniMax-01's residual factors' keys on the Hub)
FOR_THE_CONVERTER = {
    "deepseekv32-fsdp2": {
        "config.json": {"scoring_func": "sigmoid"},
        "tokenizer_config.json": {"tokenizer_class": "LlamaTokenizerFast"},
    },
    # (MiniMax-M3's text config as the Hub's names it: its sigmoid router, shared experts, dense layers and sparse
    # attention under the names the converter reads, which transformers 5 saves under others or not at all)
    "minimaxm3-fsdp2": {
        "config.json": {
            "text_config": {
                "scoring_func": "sigmoid",
                "n_shared_experts": 1,
                "moe_layer_freq": [0, 1, 1, 1],
                "sparse_attention_config": {
                    "sparse_num_index_heads": 2,
                    "sparse_index_dim": 16,
                    "sparse_topk_blocks": 2,
                    "sparse_block_size": 4,
                    "sparse_local_block": 1,
                },
            }
        }
    },
    # (MiniMax-01's as the Hub's config names it: its class, the residual factors and the rotated part of a head,
    # which transformers 5 saves under other names)
    "minimax01-fsdp2": {
        "config.json": {
            "architectures": ["MiniMaxText01ForCausalLM"],
            "rotary_dim": 16,
            **{f"layernorm_{kind}_{factor}": 1 for kind in LAYER_KINDS for factor in ("alpha", "beta")},
        }
    },
    # (Ling 3.0's as the Hub's config names it: its class, the delta attention's head width (transformers' head_dim is
    # the rotary part's), the routing and the context under the Hub's keys, which transformers 5 saves under others,
    # and what transformers' model computes: gates neither low-rank nor per element, the shared expert's width)
    "ling3-fsdp2": {
        "config.json": {
            "architectures": ["BailingMoeV3ForCausalLM"],
            "head_dim": 16,
            "max_position_embeddings": 128,
            "n_group": 2,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "score_function": "sigmoid",
            "moe_shared_expert_intermediate_size": 32,
            "no_kda_lora": True,
            "gated_attention_proj_granularity_type": "head_wise",
        }
    },
    # (Qwen4-Exp's full-attention layer as the Hub's config names it: transformers saves it `indexed_attention`, and
    # the converter then compresses no layer's keys)
    "qwen4exp-fsdp2": {"config.json": {"layer_types": ["linear_attention"] * 3 + ["full_attention"]}},
    # (GLM-5-Next's as the Hub's config names it: the delta attention's sizes in linear_attn_config, the latent
    # attention rope-less, the dense layers; transformers 5 saves them otherwise)
    "glm5next-fsdp2": {
        "config.json": {
            "text_config": {
                "linear_attn_config": {
                    "head_dim": 16,
                    "num_heads": 2,
                    "short_conv_kernel_size": 4,
                    "gate_lower_bound": -5.0,
                },
                "mla_use_nope": True,
                "first_k_dense_replace": 1,
            }
        }
    },
    # (Step 3.7's, as the Hub's remote code names it: the key-value heads, the experts, the sliding layers' heads, the
    # dense layers, rope's base and turned part by layer, the routing's renormalisation)
    "step3p7-fsdp2": {
        "config.json": {
            "text_config": {
                "num_attention_groups": 2,
                "moe_num_experts": 4,
                "moe_top_k": 2,
                "norm_expert_weight": True,
                "moe_layers_enum": "1,2,3",
                "attention_other_setting": {"num_attention_heads": 8, "num_attention_groups": 2},
                "partial_rotary_factors": [0.5, 1.0, 1.0, 0.5],
                "rope_theta": [5e6, 1e4, 1e4, 5e6],
            }
        }
    },
}


def as_minimax01_on_the_hub(folder: Path) -> None:
    """The folder's checkpoint as MiniMax-01's on the Hub holds it, which the converter reads: without the decay
    tables transformers saves (and computes from the config), with the index the converter finds the embedding by."""
    tensors = load_file(folder / "model.safetensors")
    kept = {name: t for name, t in tensors.items() if not name.endswith(("_decay", ".slope_rate"))}
    assert len(kept) == len(tensors) - 4 * 7  # (four tables in each of the seven lightning layers)
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": dict.fromkeys(kept, "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


# The checkpoint as a release holds it, where transformers saves another, by fixture
AS_ON_THE_HUB = {"minimax01-fsdp2": as_minimax01_on_the_hub}


def updated(folder: Path, changes: dict[str, dict]) -> None:
    """Each JSON file of the folder with the keys given (a dict's keys into the dict the file has there)."""
    for name, change in changes.items():
        was = json.loads((folder / name).read_text())
        merged = {
            k: {**was[k], **v} if isinstance(v, dict) and isinstance(was.get(k), dict) else v for k, v in change.items()
        }
        (folder / name).write_text(json.dumps({**was, **merged}))


@pytest.mark.parametrize("case", NEWER)
def test_a_newer_architecture_from_fsdp2_as_the_converter_and_llama_quantize_write_it(
    case, converter, llama_cpp, ggml_library, tmp_path
):
    """Granite SWA (Granite's multipliers, attention sinks, a window on three layers in four) and Granite MoE SWA
    (with experts and a shared expert, gate and up kept fused as the converter keeps them), Mellum (experts in
    every layer, a window on every second), Command R MoE (Command R7B's layout, experts behind a sigmoid router in
    every layer), DeepSeek-V3.2 (DeepSeek-V3's with the sparse attention's indexer), Hy3 (a dense first layer, then
    experts behind a sigmoid router with its correction bias and a shared expert) and Laguna (Hy3's experts behind
    attention gated per head, its heads per layer, rope of its own on the sliding layers: XS.2's layout; gated per
    element, without a window, YaRN: M.1's), HRM-Text (two stacks of layers run in cycles, gate, q, k and v in one
    tensor on disk, which unshard's folder joins from the rank files' four) and MiniMax-M3's text model (block-sparse
    attention, its indexer in F32, run with flash attention, as llama.cpp sparsifies with it alone), Step 3.7 Flash's
    (heads, window and rope of its own on the sliding layers, a gate per head, SwiGLU bounds) and Qwen4-Exp's
    (hyper-connections, QSA, hashed n-gram embeddings from a table in shards) and GLM-5-Next's (Kimi Delta Attention,
    a rope-less latent attention whose indexer keeps pools of keys, hyper-connections) and MiniMax-01 (seven layers of
    lightning attention to one of softmax attention, experts in every layer; its decay tables, which transformers saves
    and the release lacks, left out; the tokens of its vocabulary's zero rows suppressed) and Ling 3.0 (Kimi Delta
    Attention, latent attention gated per head closing each group of layers, experts chosen within groups, a shared
    expert; read from transformers' config keys, which the converter reads under the Hub's): unshard's folder
    is the fixture's model tensor for tensor; its GGUF file from the rank files (with that folder's tokenizer) is the
    converter's of that folder in f32 and q8_0 and llama-quantize's of the converter's in q4_k_m (and in q4_0, where
    llama-quantize chooses by the architecture); llama.cpp computes transformers' logits over a prompt past the window
    (past the blocks MiniMax-M3's queries keep, the pools GLM-5-Next's keeps, MiniMax-01's blocks)."""
    import transformers

    src, folder = folder_of_the_reference(case, tmp_path)
    updated(folder, AS_RELEASED.get(case, {}))
    if case in ADDED_TOKENS:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        tokenizer.add_tokens([ADDED_TOKENS[case]])
        tokenizer.save_pretrained(folder)
    pre = for_the_converter(folder)
    unshard_files(src, tmp_path, ("f32", "q8_0", "q4_k_m"), ggml_library, "--config-from", folder)
    updated(folder, FOR_THE_CONVERTER.get(case, {}))
    if case in AS_ON_THE_HUB:
        AS_ON_THE_HUB[case](folder)
    for kind in ("f32", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    header = contents(tmp_path / "f32.gguf")[0]
    assert header["general.architecture"] == NEWER[case]
    if case == "minimax01-fsdp2":  # (the tokens of the padding's zero rows, past the tokenizer's 63, suppressed)
        assert header["tokenizer.ggml.suppress_tokens"] == list(range(MINIMAX_ZERO_ROWS, 103))
    if case in ADDED_TOKENS:
        added = header["tokenizer.ggml.tokens"].index(ADDED_TOKENS[case])
        assert header["tokenizer.ggml.token_type"][added] == gguf.TokenType.CONTROL
    window = json.loads((folder / "config.json").read_text()).get("sliding_window") or 4
    prompt = [1] + [(7 * i) % 90 + 5 for i in range(PROMPT_LENGTHS.get(case, 3 * window + 2))]
    auto = transformers.AutoModelForImageTextToText if case in NEWER_VISION else transformers.AutoModelForCausalLM
    # (from the release's checkpoint where it lacks what transformers saves: MiniMax-01's decay tables then computed in
    # float32 from the config, as llama.cpp computes them, not read as the reference's bfloat16)
    model = auto.from_pretrained(folder if case in AS_ON_THE_HUB else SHIPPED / case / "reference", dtype=torch.float32)
    expected = model(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32", flash_attn=case in FLASH_ATTENTION)
    rows = COMPARED_ROWS.get(case, lambda n: list(range(n)))(len(prompt))
    logits, expected = logits[rows], expected[rows]
    distance = ((logits - expected).norm() / expected.norm()).item()
    # (measured 1.7e-7 and 1.7e-7, 3.7e-7, 3.0e-7, 2.8e-7, 3.3e-7, 4.7e-7 and 3.3e-7, 1.7e-7, 2.9e-4, 4.1e-7, 3.1e-7,
    # 3.8e-7, 3.2e-7, 6.3e-7)
    assert distance <= LLAMA_CPP_TOLERANCE["f32"]
    if case in LEGACY_TOO:  # (llama-quantize's choices of its own for the architecture, in a type gguf-py computes)
        unshard_files(src, tmp_path, ("q4_0",), ggml_library, "--config-from", folder)
        llama_cpp_client(
            "quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize-q4_0.gguf", "q4_0", "q8_0"
        )
        assert_same_file(tmp_path / "q4_0.gguf", tmp_path / "llama-quantize-q4_0.gguf")


# Hy4's tensors whose rows unshard turns from transformers' order into llama.cpp's (the rotary rows of each head, by
# halves into consecutive pairs), by llama.cpp's names: (the rows of each head, the rotary rows among them)
HY4_TURNED = {
    "attn_q_b.weight": (24, 8),
    "attn_kv_a_mqa.weight": (40, 8),
    "indexer.attn_q_b.weight": (64, 8),
    "indexer.attn_k.weight": (64, 8),
    "indexer.k_norm.weight": (64, 8),
    "indexer.k_norm.bias": (64, 8),
}


def test_hy4_from_fsdp2_as_llama_cpp_computes_the_trained_model(
    converter, llama_cpp, ggml_library, tmp_path, monkeypatch
):
    """Hy4 (DeepSeek-V3's latent attention and experts, hyper-connections, a gated attention with sinks, the sparse
    attention's indexer on two layers of 3) from FSDP2's rank files: unshard's folder holds the fixture's tensors under
    the Hub's names (transformers 5.24 saves some under others). Its config names transformers 5.24, whose Hy4 turns the
    rotary part by halves, where llama.cpp's hy_v4 turns consecutive pairs: the GGUF file is the converter's of that
    folder, field for field and tensor for tensor, but for the rotary rows of q, of the latent's key and of the
    indexer's q and k, which unshard reorders (the converter does not, and its file computes another model). llama.cpp
    computes transformers 5.24's logits from unshard's file (measured 5.2e-5; the converter's 1.8e-3); its q4_k_m is
    llama-quantize's of its f32. The same checkpoint saved by transformers 5.25 (which turns pairs, as Tencent's code
    does): the file is the converter's, and llama.cpp computes the logits of 5.24's model turning pairs as 5.25 does
    (5.2e-5)."""
    from transformers.models.hy_v4 import modeling_hy_v4

    from unshard.families.hy_v4 import HUB_NAMES

    src, folder = SHIPPED / "hyv4-fsdp2" / "global_step_1", tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    written, reference = (
        load_file(folder / "model.safetensors"),
        load_file(SHIPPED / "hyv4-fsdp2" / "reference" / "model.safetensors"),
    )

    def hub(name: str) -> str:
        for pattern, replacement in HUB_NAMES:
            name = re.sub(pattern, replacement, name)
        return name

    assert sorted(written) == sorted(map(hub, reference)) != sorted(reference)
    assert all(torch.equal(written[hub(n)], t) for n, t in reference.items())
    said = unshard_files(src, tmp_path, ("f32", "q4_k_m"), ggml_library, "--config-from", folder)
    assert "the config names transformers 5.24.0, whose Hy4 turns the rotary part of each head by halves" in said
    pre = for_the_converter(folder)
    ours, theirs = tmp_path / "f32.gguf", converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre)
    orders = {}
    for end, (head_rows, rotated) in HY4_TURNED.items():
        orders[end] = [*range(head_rows - rotated)]
        orders[end] += [
            head_rows - rotated + i for pair in zip(range(rotated // 2), range(rotated // 2, rotated)) for i in pair
        ]
    # (q's and the key's on 3 layers, the indexer's on the 2 that own one)
    assert the_converter_s_but_reordered(ours, theirs, orders) == 2 * 3 + 4 * 2
    llama_cpp_client("quantize", ours, tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    distances = [llama_cpp_from_transformers(llama_cpp, file, "hyv4-fsdp2") for file in (ours, theirs)]
    assert distances[0] <= LLAMA_CPP_TOLERANCE["f32"] and distances[1] > 10 * distances[0], distances

    updated(folder, {"config.json": {"transformers_version": "5.25.0"}})
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    said = unshard_files(src, pairs, ("f32",), ggml_library, "--config-from", folder)
    assert "the config names transformers 5.25.0, so the rotary part is taken as turned by consecutive pairs" in said
    assert the_converter_s_but_reordered(pairs / "f32.gguf", theirs, {}) == 0
    monkeypatch.setattr(modeling_hy_v4, "apply_rotary_pos_emb", turned_by_pairs)
    assert llama_cpp_from_transformers(llama_cpp, pairs / "f32.gguf", "hyv4-fsdp2") <= LLAMA_CPP_TOLERANCE["f32"]


@pytest.mark.parametrize(
    "config, halves",
    [
        ({"transformers_version": "5.24.0"}, True),
        ({"transformers_version": "5.17.0.dev0"}, True),  # (the release that added Hy4)
        ({"transformers_version": "5.25.0"}, False),
        ({"transformers_version": "6.1.0"}, False),
        ({"transformers_version": "4.57.1"}, False),  # (before transformers had Hy4: the trainer's own code)
        ({"transformers_version": "5.24.0", "auto_map": {"AutoModelForCausalLM": "modeling.HY"}}, False),
        ({}, False),
    ],
)
def test_hy4_rotary_rows_are_reordered_only_for_a_trainer_that_turned_halves(config, halves):
    from unshard.families.hy_v4 import hy_v4_tensors

    hparams = {"qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "kv_lora_rank": 32, "index_head_dim": 64, **config}
    how = hy_v4_tensors("model.layers.0.self_attn.q_b_proj.weight", (2 * 24, 32), hparams, Path("config.json"))
    assert (how is not None) == halves


def turned_by_pairs(q, k, cos, sin, unsqueeze_dim=1):
    """transformers 5.25's Hy4 rotary turn in 5.24's place: each consecutive pair of a head's rotary dimensions turned
    by one angle (cos and sin hold each angle twice, as the halves' turn reads them; 5.25 lays the turned pairs out as
    halves, an order the attention's dot products do not see)."""
    half = cos.shape[-1] // 2
    cos, sin = cos[..., :half].unsqueeze(unsqueeze_dim), sin[..., :half].unsqueeze(unsqueeze_dim)

    def turned(x):
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.cat((even * cos - odd * sin, odd * cos + even * sin), dim=-1)

    return turned(q), turned(k)


def test_bamba_from_fsdp2_as_llama_cpp_computes_transformers_model(converter, llama_cpp, ggml_library, tmp_path):
    """Bamba (Mamba-2 layers beside two attention layers with rope on the first half of each head, an MLP in every
    layer) from FSDP2's rank files: the GGUF file is the converter's of the Hub's config (which names the rotary width,
    attn_rotary_emb, where transformers saves none and unshard writes the half of each head it turns), field for field
    and tensor for tensor, but for q's and k's rotary rows, which transformers turns by halves and llama.cpp's
    granitehybrid by consecutive pairs: unshard reorders them within the rotary half, where the converter reorders
    whole heads (and its file computes another model). llama.cpp computes transformers' logits from unshard's file
    (measured 4.1e-7; the converter's 3.8e-3); q4_k_m is llama-quantize's of unshard's f32."""
    from unshard.families.parts import pairs_from_halves

    src, folder = folder_of_the_reference("bamba-fsdp2", tmp_path)
    said = unshard_files(src, tmp_path, ("f32", "q4_k_m"), ggml_library, "--config-from", folder)
    assert "q's and k's rows are reordered within that half (the config names no attn_rotary_emb: 8 written)" in said
    pre = for_the_converter(folder)
    updated(folder, {"config.json": {"attn_rotary_emb": 8}})
    ours, theirs = tmp_path / "f32.gguf", converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre)
    # (the converter's rows of each head of 16: halves into pairs over the whole head; unshard's over its first 8)
    whole, rotary = pairs_from_halves(16, 16, 0), pairs_from_halves(16, 8, 0)
    order = [whole.index(row) for row in rotary]
    assert the_converter_s_but_reordered(ours, theirs, dict.fromkeys(("attn_q.weight", "attn_k.weight"), order)) == 4
    assert contents(ours)[0]["granitehybrid.rope.dimension_count"] == 8
    llama_cpp_client("quantize", ours, tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    distances = [llama_cpp_from_transformers(llama_cpp, file, "bamba-fsdp2") for file in (ours, theirs)]
    assert distances[0] <= LLAMA_CPP_TOLERANCE["f32"] and distances[1] > 10 * distances[0], distances


def the_converter_s_but_reordered(ours: Path, theirs: Path, orders: dict[str, list[int]]) -> int:
    """Asserts every field and tensor of an f32 file (ours) the converter's file's (theirs) but those whose names end
    as a key of `orders`: each head's rows (as many as the order lists) the converter's, in that order, and not as the
    converter has them. Returns how many tensors are so reordered."""
    mine, expected = contents(ours), contents(theirs)
    assert mine[0] == expected[0] and list(mine[0]) == list(expected[0])
    assert [t[:3] for t in mine[1]] == [t[:3] for t in expected[1]]
    reordered = 0
    for (name, _, shape, data), (_, _, _, oracle) in zip(mine[1], expected[1]):
        order = orders.get(name.split(".", 2)[-1])
        if order is None:
            assert data == oracle, name
            continue
        columns = shape[0] if len(shape) == 2 else 1  # (gguf's shape: columns first)
        heads = np.frombuffer(oracle, dtype=np.float32).reshape(-1, len(order), columns)
        assert data == heads[:, order].tobytes() != oracle, name
        reordered += 1
    return reordered


def llama_cpp_from_transformers(llama_cpp, gguf_file: Path, case: str, **options) -> float:
    """The relative distance of llama.cpp's logits from an f32 file to transformers' of the fixture's reference model,
    over a prompt of 14 tokens (past the fixtures' windows of 4 and the tokens their indexers keep)."""
    import transformers

    prompt = [1] + [(7 * i) % 90 + 5 for i in range(13)]
    reference = SHIPPED / case / "reference"
    named = getattr(transformers, json.loads((reference / "config.json").read_text())["architectures"][0])
    expected = named.from_pretrained(reference, dtype=torch.float32)(torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(gguf_file, prompt, 0, kv_cache="f32", **options)
    return ((logits - expected).norm() / expected.norm()).item()


# dots3-note's indexer's tensors whose rows unshard turns from transformers' order into llama.cpp's (each head's 8
# rotary rows, the first of its 64, from consecutive pairs into halves), by llama.cpp's names
DOTS3_TURNED = ("indexer.attn_q_b.weight", "indexer.attn_k.weight", "indexer.k_norm.weight", "indexer.k_norm.bias")


@pytest.mark.parametrize("case", ["dots3note-fsdp2", "dots3notevl-fsdp2"])
def test_dots3_note_from_fsdp2_as_llama_cpp_computes_transformers_model(
    case, converter, llama_cpp, ggml_library, tmp_path
):
    """dots3-note's text model (DeepSeek's latent attention in two geometries, the global layers' with the sparse
    attention's indexer, the sliding layers' wider in heads over a narrower latent; the latents rescaled, the rotary
    key normed, a gate per head; a dense first layer, then experts) from FSDP2's rank files, alone and as released
    (beside a vision tower and an audio encoder, which the text model's file leaves out as the converter's does), its
    config as
    transformers 5 saves it: the GGUF file is the converter's of the Hub's config, field for field and tensor for
    tensor, but for
    the indexer's rotary rows, which transformers' dots3-note turns by consecutive pairs and llama.cpp's dots3note by
    halves: unshard reorders them (the converter does not, and its file's indexer keeps other tokens). llama.cpp
    computes transformers' logits from unshard's file over a prompt past the window and the 4 tokens the indexer keeps
    (measured 3.8e-7; the converter's 2.8e-1); q4_k_m is llama-quantize's of its f32."""
    src, folder = folder_of_the_reference(case, tmp_path)
    unshard_files(src, tmp_path, ("f32", "q4_k_m"), ggml_library, "--config-from", folder)
    pre = for_the_converter(folder)
    if case == "dots3notevl-fsdp2":  # (the release's config.json, its text model's settings at the top, where the
        # converter reads them; transformers 5 saves them in text_config)
        config = json.loads((folder / "config.json").read_text())
        text = {key: value for key, value in config.pop("text_config").items() if key != "model_type"}
        (folder / "config.json").write_text(json.dumps({**config, **text}))
    updated(folder, {"config.json": DOTS3_ON_THE_HUB})
    ours, theirs = tmp_path / "f32.gguf", converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre)
    order = [*range(0, 8, 2), *range(1, 8, 2), *range(8, 64)]
    assert the_converter_s_but_reordered(ours, theirs, dict.fromkeys(DOTS3_TURNED, order)) == 4 * 2  # (2 layers)
    header = contents(ours)[0]
    assert header["dots3note.attention.head_count"] == [4, 8, 8, 4] and header["dots3note.rope.freq_base_swa"] == 5e4
    llama_cpp_client("quantize", ours, tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    distances = [llama_cpp_from_transformers(llama_cpp, file, case) for file in (ours, theirs)]
    assert distances[0] <= LLAMA_CPP_TOLERANCE["f32"] and distances[1] > 10 * distances[0], distances


# dots3-note's towers as the Hub's release names their settings, which the converter reads (transformers 5 saves them
# under its own names): the vision tower's width, heads and experts of each block, the audio encoder's Whisper-style
# sizes and the variant the converter checks, the image processor's least and most pixels
DOTS3_TOWERS_ON_THE_HUB = {
    "config.json": {
        "vision_config": {
            "embed_dim": 32,
            "num_heads": 2,
            "pyramid_num_routed": [-1, 4],
            "capacity_factor": 2,
            "adapter_type": "patch_merger",
            "pre_pixel_shuffle": True,
            "router_scoring_func": "sigmoid",
            "router_scale": 1.0,
            "temporal_patch_size": 1,
            "use_bias": False,
            "use_qk_norm": True,
        },
        "audio_config": {
            "use_conv2d_stem": True,
            "use_rope": True,
            "use_rms_norm": True,
            "use_causal": False,
            "merge_factor": 1,
            "chunk_seconds": 60,
            "whisper_config": {
                "activation_function": "swiglu",
                "d_model": 32,
                "encoder_ffn_dim": 48,
                "encoder_attention_heads": 2,
                "encoder_layers": 2,
                "num_mel_bins": 16,
            },
        },
    },
    "preprocessor_config.json": {"min_pixels": 56 * 56, "max_pixels": 112 * 112},
}


def test_dots3_note_s_towers_as_the_converter_writes_them_and_see_and_hear_as_transformers(
    converter, ggml_library, tmp_path
):
    """dots3-note's vision tower (experts on its second block, stacked per block) and audio encoder (three strided
    convolutions, Whisper's layers with rope on half of each head and a SwiGLU MLP, whose fused gate and up the file
    holds apart) in one mmproj file of llama.cpp's dots3note_v and dots3note_a projectors, from FSDP2's rank files:
    the converter's `--mmproj` file of the Hub's config in f32 and q8_0; mtmd's embeddings of an image wider than high
    and of a second of sound are transformers' image and audio features of the same pixels and samples."""
    from transformers import AutoModelForImageTextToText, Dots3NoteFeatureExtractor

    src, folder = folder_of_the_reference("dots3notevl-fsdp2", tmp_path)
    unshard_files(src, tmp_path, ("f32", "q8_0"), ggml_library)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    # (6 x 8 patches: 12 tokens after the 2 x 2 merge, through the experts; measured 1.8e-4)
    assert seen_as_transformers(model, folder, 84, 12, tmp_path, width=112) <= IMAGE_TOLERANCE["f32"]
    rng, samples = np.random.default_rng(0), 16000
    sound = 0.3 * np.sin(2 * np.pi * 440 * np.arange(samples) / 16000) + 0.05 * rng.standard_normal(samples)
    sound.astype(np.float32).tofile(tmp_path / "sound.f32")
    files = (tmp_path / "f32.gguf", tmp_path / "mmproj-f32.gguf")
    llama_cpp_client("audio", *files, tmp_path / "sound.f32", tmp_path / "sound.npy")
    heard = torch.from_numpy(np.load(tmp_path / "sound.npy"))
    features = Dots3NoteFeatureExtractor(feature_size=16)(sound, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        expected = model.model.get_audio_features(features["input_features"], features["chunk_sample_lengths"])
    expected = expected.pooler_output.reshape(-1, heard.shape[-1])
    assert heard.shape == expected.shape == (13, 64)  # (100 frames, a token of 8)
    assert ((heard - expected).norm() / expected.norm()).item() <= AUDIO_TOLERANCE["f32"]  # (measured 1.9e-4)
    updated(folder, DOTS3_TOWERS_ON_THE_HUB)
    for kind in ("f32", "q8_0"):
        mmproj = converter(folder, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    header = contents(tmp_path / "mmproj-f32.gguf")[0]
    assert (
        header["clip.vision.expert_count_per_layer"] == [0, 4] and header["clip.audio.projector_type"] == "dots3note_a"
    )


# Gemma 4's drafters, and what the converter reads that transformers' save does not name: Gemma 4 Unified's experts'
# width (none, as for Gemma 4 Unified's own text model)
DRAFTERS = {
    "gemma4assistant-fsdp2": {},
    "gemma4unifiedassistant-fsdp2": {"config.json": {"text_config": {"moe_intermediate_size": None}}},
}


@pytest.mark.parametrize("case", DRAFTERS)
def test_gemma_4_s_drafters_as_the_converter_and_llama_quantize_write_them(case, converter, ggml_library, tmp_path):
    """Gemma 4's and Gemma 4 Unified's assistants (drafters whose layers read the keys and values of the model they
    draft for, between a projection from twice that model's width and one back to it): unshard's folder is the
    fixture's model tensor for tensor; its GGUF file from the rank files is the converter's of that folder in f32 (the
    width it projects back to and its layers as predicted-next ones in the header; its masked embedding left out,
    with a note) and llama-quantize's in q4_k_m. llama.cpp runs a drafter only beside its target's context, so no
    logits are compared here: its layers are Gemma 4's, whose files the tests above run; the folder's logits are
    transformers' (test_fsdp_convert)."""
    src, folder = folder_of_the_reference(case, tmp_path)
    assert "2 tensors beside the text model left out" in unshard_files(src, tmp_path, ("f32", "q4_k_m"), ggml_library)
    pre = for_the_converter(folder)
    updated(folder, DRAFTERS[case])
    assert_same_file(tmp_path / "f32.gguf", converter(folder, "f32", tmp_path / "oracle-f32.gguf", pre=pre))
    llama_cpp_client("quantize", tmp_path / "oracle-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize.gguf")
    header, tensors = contents(tmp_path / "f32.gguf")
    assert header["general.architecture"] == "gemma4-assistant"
    assert (
        header["gemma4-assistant.embedding_length_out"] == 48 and header["gemma4-assistant.nextn_predict_layers"] == 4
    )
    assert {"nextn.pre_projection.weight", "nextn.post_projection.weight"} <= {t[0] for t in tensors}


@pytest.mark.parametrize(
    "case, change, message",
    [
        (
            "mellum-fsdp2",
            {"rope_parameters": {"full_attention": {"rope_theta": 5e5}, "sliding_attention": {"rope_theta": 1e4}}},
            "the sliding layers turn rope at 10000.0 and the others at 500000.0, and llama.cpp's mellum turns",
        ),
        (
            "mellum-fsdp2",
            {"mlp_layer_types": ["dense", "sparse", "sparse", "sparse"]},
            "llama.cpp's mellum runs experts in every layer",
        ),
        ("mellum-fsdp2", {"norm_topk_prob": False}, "norm_topk_prob is off, and llama.cpp's mellum renormalises"),
        ("cohere2moe-fsdp2", {"num_shared_experts": 1}, "num_shared_experts is set: shared experts, which unshard"),
        ("cohere2moe-fsdp2", {"expert_selection_fn": "softplus"}, "the experts' gating function 'softplus' is not"),
        ("deepseekv32-fsdp2", {}, "tokenizer_config.json: add_bos_token is not true, and DeepSeek-V3.2 reads"),
        (
            "laguna-fsdp2",
            {"layer_types": ["sliding_attention", "full_attention"] * 2},
            "and llama.cpp's laguna slides the window on all but every fourth layer",
        ),
        ("lagunam1-fsdp2", {"sliding_window": 512}, "and llama.cpp's laguna slides the window on all but every"),
        ("laguna-fsdp2", {"moe_router_logit_softcapping": 30.0}, "and llama.cpp's laguna caps no router logits"),
        ("lagunam1-fsdp2", {"gating": "per_head"}, "gating is 'per_head': neither per-head nor per-element"),
        ("hrmtext-fsdp2", {"hidden_act": "gelu"}, "hidden_act is 'gelu', and llama.cpp's hrm_text runs SiLU"),
        ("minimaxm3-fsdp2", {"text_config": {"swiglu_limit": 10.0}}, "swiglu_alpha and swiglu_limit are not"),
        ("minimaxm3-fsdp2", {"text_config": {"rotary_dim": 16}}, "rotary_dim is 16 and transformers turns 8"),
        (
            "minimaxm3-fsdp2",
            {"vision_config": {"rope_parameters": {"rope_type": "axial", "rope_theta": 5e4}}},
            "the vision tower's rope_theta is 50000.0, and llama.cpp's minimaxm3 projector computes 10000.0",
        ),
        ("minimaxm3-fsdp2", {"vision_config": {"hidden_act": "quick_gelu"}}, "hidden_act is quick_gelu, and llama.cpp"),
        ("dots3note-fsdp2", {"n_group": 2}, "the experts are routed in groups, which llama.cpp's dots3note"),
        (
            "minicpmv46-fsdp2",
            {"vision_config": {"hidden_act": "gelu"}},
            "hidden_act is gelu, and llama.cpp's minicpmv4_6 projector computes gelu_pytorch_tanh",
        ),
        ("minicpmv46-fsdp2", {"downsample_mode": "4x"}, "downsample_mode is 4x (and 16x in preprocessor_config"),
        ("bamba-fsdp2", {"attn_rotary_emb": 16}, "attn_rotary_emb is 16, which the converter would write, where"),
        ("bamba-fsdp2", {"time_step_limit": [0.0, 10.0]}, "llama.cpp's granitehybrid clamps no time step"),
        ("hyv4-fsdp2", {"norm_topk_prob": False}, "norm_topk_prob is off, and llama.cpp's hy_v4 renormalises"),
        ("hyv4-fsdp2", {"n_group": 2}, "its experts are routed in groups, which llama.cpp's hy_v4 does not read"),
        ("hyv4-fsdp2", {"indexer_types": ["shared", "full", "full"]}, "the first layer's indexer_types is not `full`"),
        (
            "step3p7-fsdp2",
            {"text_config": {"gating": "per-element"}},
            "gating is 'per-element', and llama.cpp's step35",
        ),
        ("step3p7-fsdp2", {"text_config": {"query_pre_attn_scalar": 32}}, "query_pre_attn_scalar is not head_dim"),
        (
            "step3p7-fsdp2",
            {"text_config": {"mlp_layer_types": ["sparse", "dense", "sparse", "sparse"]}},
            "a dense layer follows a layer with experts",
        ),
        ("glm5next-fsdp2", {"text_config": {"hc_mult": 2}}, "hc_mult is 2, and llama.cpp's glm5-next runs 4 streams"),
        ("glm5next-fsdp2", {"text_config": {"n_group": 2}}, "its experts are routed in groups, which llama.cpp's"),
        (
            "glm5next-fsdp2",
            {"text_config": {"indexer_types": ["full", "full", "shared", "full"]}},
            "the first latent layer's indexer_types is not `full`",
        ),
        ("glm5next-fsdp2", {"vision_config": {"hidden_act": "gelu"}}, "hidden_act is 'gelu', and llama.cpp's glm5v"),
        ("dots3notevl-fsdp2", {"vision_config": {"hidden_act": "gelu"}}, "the vision tower's hidden_act is gelu"),
        (
            "dots3notevl-fsdp2",
            {"audio_config": {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}},
            "the audio tower's partial_rotary_factor is 0.25, and llama.cpp's dots3note_a computes 0.5",
        ),
        ("qwen4exp-fsdp2", {"output_gate_type": "silu"}, "output gate is 'silu' (output_gate_type, else hidden_act)"),
        ("qwen4exp-fsdp2", {"ple_layer_ids": [1, 2]}, "ple_layer_ids names 2 layers, and llama.cpp's qwen4exp adds"),
        (
            "step3p7-fsdp2",
            {"text_config": {"use_bidirectional_attention": True}},
            "use_bidirectional_attention is set, and llama.cpp's step35 attends causally",
        ),
        ("gemma4unified-fsdp2", {"vision_config": {"pooling_kernel_size": 2}}, "pooling_kernel_size is 2, and llama"),
        ("gemma4unified-fsdp2", {"vision_config": {"rms_norm_eps": 1e-5}}, "rms_norm_eps is 1e-05, and llama.cpp's"),
        ("gemma4unified-fsdp2", {"audio_config": {"audio_embed_dim": 320}}, "audio_embed_dim is 320, and llama.cpp's"),
        ("minimax01-fsdp2", {"mlp_alpha_factor": 0.8}, "llama.cpp's minimax-01 scales every residual by one factor"),
        ("minimax01-fsdp2", {"layernorm_mlp_beta": 0.5}, "llama.cpp's minimax-01 scales every residual by one factor"),
        (
            "minimax01-fsdp2",
            {"layer_types": ["linear_attention", "full_attention"] * 4},
            "llama.cpp's minimax-01 makes every 8th layer softmax attention",
        ),
        ("minimax01-fsdp2", {"hidden_act": "gelu"}, "the activation is 'gelu', and llama.cpp's minimax-01 runs SiLU"),
        (
            "ling3-fsdp2",
            {"layer_types": ["full_attention", "linear_attention"] * 2},
            "layer_types puts latent attention elsewhere than at the end of each group of 2 layers",
        ),
        ("ling3-fsdp2", {"no_kda_lora": False}, "the delta attention's gates are low-rank (no_kda_lora is off)"),
        ("ling3-fsdp2", {"kda_safe_gate": False}, "kda_safe_gate is off, and llama.cpp's bailingmoe3 runs the safe"),
        ("ling3-fsdp2", {"expert_swiglu_limit_list": [7.0] * 4}, "the experts' SwiGLU is clamped, which transformers"),
    ],
)
def test_a_newer_architecture_llama_cpp_would_compute_otherwise_is_one_line(case, change, message, tmp_path):
    """A Mellum llama.cpp's mellum would compute otherwise (rope on its sliding layers at their own base, which it
    turns at the global layers', a dense layer, the chosen experts' weights as they are), a Command R MoE with what
    unshard has not compared with llama.cpp (shared experts) or a router llama.cpp lacks, a Laguna whose window
    llama.cpp's laguna would slide on other layers (or on every layer of M.1's config given a window), whose router's
    logits are capped, or whose gate transformers reads per element and the converter per head, an HRM-Text of another
    activation, a MiniMax-M3 of another SwiGLU than llama.cpp's, whose rotary_dim is not what transformers turns or
    whose tower's rope or activation llama.cpp's minimaxm3 projector fixes otherwise, a MiniCPM-V 4.6 of another
    activation or of the 4x mode (not written yet), a dots3-note whose experts are routed in groups, a
    Step 3.7 gated per element, its queries scaled otherwise, a dense layer after an expert one or attending both ways,
    a Qwen4-Exp whose linear attention is gated by SiLU or whose n-gram embeddings are on two layers, a GLM-5-Next of
    two hyper-connection streams, experts routed in groups, a first latent layer without an indexer
    of its own, or a tower of another activation than SiLU, a dots3-note tower of another activation or rope, a Gemma
    4 Unified whose image patches are merged otherwise than 3 x 3, its norm at another epsilon, or whose sound frames
    are not 640 samples wide (llama.cpp's gemma4uv and gemma4ua fix them in code), a MiniMax-01 whose residuals are
    scaled otherwise (by transformers' keys or the Hub's), whose softmax layers are elsewhere than every eighth, or of
    another activation, a Ling 3.0 whose latent attention is elsewhere than closing each group, whose delta attention's
    gates are low-rank or unsafe, or whose experts' SwiGLU is clamped, a Bamba whose config names another rotary width
    than the half of each head transformers turns, or whose time step is clamped: one line naming config.json, nothing
    written.
    Said before transformers is asked for the model's names; the text model's refusals also before the installed
    gguf-py (PyPI's, in this process) is asked for the architecture: no use installing llama.cpp's for a model it
    refuses."""
    folder = tmp_path / "hf"
    unshard.convert(SHIPPED / case / "global_step_1", folder, progress=False)
    updated(folder, {"config.json": change})
    if message in WITH_LLAMA_CPP_GGUF_PY:
        # (--no-check: the config's dense layer would not fit the checkpoint's experts; the file's own check says why)
        done = unshard_with_llama_cpp_gguf_py("convert", folder, tmp_path / "m.gguf", "--no-progress", "--no-check")
        assert done.returncode != 0 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        said = done.stderr.removeprefix("unshard: error: ")
    else:
        with pytest.raises(ConfigMismatchError) as refused:
            unshard.convert(folder, tmp_path / "m.gguf", output=unshard.OutputOptions(gguf="f32"), check=False)
        said = str(refused.value)
        assert len(said.splitlines()) == 1, said
    assert said.startswith(str(folder)) and "config.json: " in said and message in said, said
    assert not (tmp_path / "m.gguf").exists()


# Refusals of the towers, and of the header's experts' gating, which only llama.cpp's own gguf-py reaches (PyPI's lacks
# these architectures' projectors, and writes the text model alone)
WITH_LLAMA_CPP_GGUF_PY = {
    "the experts' gating function 'softplus' is not",
    "the vision tower's rope_theta is 50000.0, and llama.cpp's minimaxm3 projector computes 10000.0",
    "hidden_act is quick_gelu, and llama.cpp",
    "hidden_act is gelu, and llama.cpp's minicpmv4_6 projector computes gelu_pytorch_tanh",
    "downsample_mode is 4x (and 16x in preprocessor_config",
    "hidden_act is 'gelu', and llama.cpp's glm5v",
    "the vision tower's hidden_act is gelu",
    "the audio tower's partial_rotary_factor is 0.25, and llama.cpp's dots3note_a computes 0.5",
    "pooling_kernel_size is 2, and llama",
    "rms_norm_eps is 1e-05, and llama.cpp's",
    "audio_embed_dim is 320, and llama.cpp's",
}


def test_exaone_4_5_s_vision_tower_as_the_converter_writes_it_and_sees_as_transformers(converter, tmp_path):
    """EXAONE 4.5's tower (Qwen2-VL's with grouped attention, its qkv whole, Qwen2.5-VL's windows) as the mmproj file
    of llama.cpp's exaone4_5 projector, which PyPI's gguf-py lacks: with llama.cpp's own, the converter's `--mmproj`
    file in f32 and q8_0, and mtmd's embeddings of an image transformers' image features; with PyPI's, the same text
    model's file and the towers left out, with a note saying how to write them."""
    from transformers import AutoModelForImageTextToText

    src, folder = SHIPPED / "exaone45-fsdp2" / "global_step_1", tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    # (the Hub's pixel bounds, which the converter reads; transformers 5 saves them as the size's edges)
    bounds = {"min_pixels": processor["size"]["shortest_edge"], "max_pixels": processor["size"]["longest_edge"]}
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, **bounds}))
    pre = for_the_converter(folder)
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind)
        assert done.returncode == 0, done.stderr
        theirs = contents(converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre, mmproj=True))
        ours = contents(tmp_path / f"mmproj-{kind}.gguf")
        assert list(ours[0].items()) == list(theirs[0].items()) and ours[0]["clip.projector_type"] == "exaone4_5"
        assert_same_tensors(ours[1], theirs[1])
    the_text_model_alone_with_pypi_gguf_py(src, tmp_path, "EXAONE4_5")
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    # (the processor's bounds: 4 x 4 patches, 4 tokens after the 2 x 2 merger)
    assert seen_as_transformers(model, folder, 56, 4, tmp_path) <= IMAGE_TOLERANCE["f32"]  # (measured 3.7e-4)


def test_minimax_m3_s_vision_tower_as_the_converter_writes_it_and_sees_as_transformers(
    converter, ggml_library, tmp_path
):
    """MiniMax-M3's tower (Qwen2-VL's two-frame patches, CLIP's layers, rope over height and width on part of each
    head) and its two projectors (each patch, then 2 x 2 patches into one token) as the mmproj file of llama.cpp's
    minimaxm3 projector, from FSDP2's rank files with llama.cpp's own gguf-py: the converter's `--mmproj` file in f32
    and q8_0 (q and k with each head's rotary rows reordered by axis, the Conv3D patch embedding as one convolution per
    frame), and mtmd's embeddings of an image wider than high transformers' image features of the same pixels."""
    from transformers import AutoModelForImageTextToText

    src, folder = folder_of_the_reference("minimaxm3-fsdp2", tmp_path)
    unshard_files(src, tmp_path, ("f32", "q8_0"), ggml_library, "--config-from", folder)
    for kind in ("f32", "q8_0"):
        mmproj = converter(folder, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    assert contents(tmp_path / "mmproj-f32.gguf")[0]["clip.projector_type"] == "minimax_m3"
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    # (6 x 8 patches: 12 tokens after the 2 x 2 merge; measured 2.5e-5)
    assert seen_as_transformers(model, folder, 84, 12, tmp_path, width=112) <= IMAGE_TOLERANCE["f32"]


def test_glm5_next_s_vision_tower_as_the_converter_writes_it_and_sees_as_transformers(
    converter, ggml_library, tmp_path
):
    """GLM-5-Next's tower (GLM-4.1V's: Qwen2-VL's two-frame patches, q, k and v fused, merged 2 x 2 by a convolution
    into a SwiGLU projector; with q and k normed per head, no learned positions, its SwiGLU clamped) as the mmproj file
    of llama.cpp's glm5v projector, from FSDP2's rank files with llama.cpp's own gguf-py: the converter's `--mmproj`
    file in f32 and q8_0 (the image processor's token budget in pixels, which mtmd resizes by), and mtmd's embeddings
    of an image wider than high transformers' image features of the same pixels."""
    from transformers import AutoModelForImageTextToText

    src, folder = folder_of_the_reference("glm5next-fsdp2", tmp_path)
    unshard_files(src, tmp_path, ("f32", "q8_0"), ggml_library)
    for kind in ("f32", "q8_0"):
        mmproj = converter(folder, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    header = contents(tmp_path / "mmproj-f32.gguf")[0]
    assert header["clip.projector_type"] == "glm5v" and header["clip.vision.image_max_pixels"] == 64 * 28 * 28
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    # (6 x 8 patches: 12 tokens after the 2 x 2 merge; measured 6.6e-4)
    assert seen_as_transformers(model, folder, 84, 12, tmp_path, width=112) <= IMAGE_TOLERANCE["f32"]


def the_text_model_alone_with_pypi_gguf_py(src: Path, tmp_path: Path, projector: str) -> None:
    """Asserts that with PyPI's gguf-py (this venv's), which lacks llama.cpp's `projector`, unshard writes the text
    model's file it writes with llama.cpp's own (tmp_path/f32.gguf) and no mmproj file, with a note saying why."""
    done = subprocess.run(
        [sys.executable, "-m", "unshard", "convert", src, tmp_path / "pypi" / "f32.gguf", "--gguf-type", "f32"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and f"lacks llama.cpp's {projector} projector" in done.stderr, done.stderr
    assert_same_file(tmp_path / "pypi" / "f32.gguf", tmp_path / "f32.gguf")
    assert not (tmp_path / "pypi" / "mmproj-f32.gguf").exists()


def seen_as_transformers(model, folder: Path, side: int, tokens: int, tmp_path: Path, width: int = 0) -> float:
    """mtmd's embeddings of an image of noise, side pixels high and width (else side) wide (f32.gguf and its mmproj
    file in tmp_path) against the model's image features of the same pixels, which the folder's processor leaves at
    their size (MiniCPM-V's resizes and slices them, as mtmd does): their relative distance."""
    from transformers import AutoImageProcessor

    width = width or side
    image = np.random.default_rng(0).integers(0, 256, (side, width, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    processor = AutoImageProcessor.from_pretrained(folder)
    with torch.no_grad():
        if "target_sizes" in processor.model_input_names:  # (MiniCPM-V's: an overview and slices, each its patches)
            pixels = processor(images=[image], return_tensors="pt")
            features = model.model.get_image_features(
                pixel_values=pixels["pixel_values"], target_sizes=pixels["target_sizes"]
            )
        else:
            pixels = processor(images=[image], do_resize=False, return_tensors="pt")
            features = model.model.get_image_features(
                pixel_values=pixels["pixel_values"], image_grid_thw=pixels["image_grid_thw"]
            )
    expected = torch.cat(list(features.pooler_output))
    files = (tmp_path / "f32.gguf", tmp_path / "mmproj-f32.gguf")
    llama_cpp_client("image", *files, width, side, tmp_path / "image.rgb", tmp_path / "image.npy")
    embeddings = torch.from_numpy(np.load(tmp_path / "image.npy"))
    assert embeddings.shape == expected.shape == (tokens, model.config.text_config.hidden_size), embeddings.shape
    return ((embeddings - expected).norm() / expected.norm()).item()


def test_qwen4_exp_as_released_both_files_as_the_converter_writes_them_and_sees_as_transformers(
    converter, llama_cpp, tmp_path
):
    """Qwen4-Exp as released (Qwen4ExpForConditionalGeneration: its text model beside Qwen3-VL's tower), from FSDP2's
    rank files with llama.cpp's gguf-py: the text model's file and the mmproj file are the converter's in f16 and q8_0
    (given the Hub's name of the full-attention layer); llama.cpp computes transformers' logits over a prompt within
    QSA's budget, and mtmd encodes an image into transformers' image features."""
    from transformers import AutoModelForImageTextToText

    src, folder = SHIPPED / "qwen4expvl-fsdp2" / "global_step_1", tmp_path / "hf"
    unshard.convert(src, folder, progress=False)
    theirs = tmp_path / "for-the-converter"
    shutil.copytree(folder, theirs)
    config = json.loads((theirs / "config.json").read_text())
    config["text_config"]["layer_types"] = ["linear_attention"] * 3 + ["full_attention"]
    (theirs / "config.json").write_text(json.dumps(config))
    pre = for_the_converter(theirs)
    for kind in ("f16", "q8_0", "f32"):
        done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind)
        assert done.returncode == 0, done.stderr
    for kind in ("f16", "q8_0"):
        assert_same_file(tmp_path / f"{kind}.gguf", converter(theirs, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
        mmproj = converter(theirs, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", pre=pre, mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = model(input_ids=torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]  # (measured 3.3e-7)
    # (3 x 3 tokens of Qwen3-VL's 16-pixel patches merged 2 x 2)
    assert seen_as_transformers(model, folder, 96, 9, tmp_path) <= IMAGE_TOLERANCE["f32"]  # (measured 4.1e-4)


def test_minicpm_v_4_6_s_files_as_the_converter_writes_them_and_sees_as_transformers(converter, llama_cpp, tmp_path):
    """MiniCPM-V 4.6 (Qwen3.5's text model beside a SigLIP tower, a window-attention merger of 2 x 2 patches after one
    of its layers, an MLP merging 2 x 2 again) from FSDP2's rank files: with llama.cpp's own gguf-py, the text model's
    file (llama.cpp's qwen35) and the mmproj file (its minicpmv4_6 projector) are the converter's in f32 and q8_0;
    with PyPI's, the same text model's file and the towers left out, with a note saying how to write them. llama.cpp
    computes transformers' logits, and mtmd turns an image twice as wide as the processor's slices (an overview of 1 x
    3 tokens, then two slices of 2 x 2) into transformers' image features."""
    from transformers import AutoModelForImageTextToText

    src, folder = folder_of_the_reference("minicpmv46-fsdp2", tmp_path)
    pre = for_the_converter(folder)
    for kind in ("f32", "q8_0"):
        done = unshard_with_llama_cpp_gguf_py("convert", src, tmp_path / f"{kind}.gguf", "--gguf-type", kind)
        assert done.returncode == 0, done.stderr
        text = converter(folder, kind, tmp_path / f"oracle-{kind}.gguf", pre=pre, more=("--no-mtp",))
        assert_same_file(tmp_path / f"{kind}.gguf", text)
        mmproj = converter(folder, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", pre=pre, mmproj=True)
        assert_same_file(tmp_path / f"mmproj-{kind}.gguf", mmproj)
    the_text_model_alone_with_pypi_gguf_py(src, tmp_path, "MINICPMV4_6")
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32)
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = model(input_ids=torch.tensor([prompt])).logits[0].detach()
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0, kv_cache="f32")
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]
    # (the overview resized by each, the slices as they are; measured 3.2e-4)
    assert seen_as_transformers(model, folder, 112, 11, tmp_path, width=224) <= IMAGE_TOLERANCE["f32"]


def test_one_architecture_s_names_do_not_leak_into_the_next_file_s():
    """gguf-py's TensorNameMap updates the table of names its class shares with an architecture's own (Qwen4-Exp's
    indexer norms over those of Hy4's), in place: in one process, a Hy4 file planned after a Qwen4-Exp file still
    finds its indexer's k_norm, as it would alone (llama.cpp's gguf-py, in a process of its own)."""
    code = (
        "import gguf\n"
        "from unshard.families.gguf_hooks import tensor_name_map\n"
        "tensor_name_map(gguf.MODEL_ARCH.QWEN4EXP, 2)\n"
        "names = tensor_name_map(gguf.MODEL_ARCH.HY_V4, 2)\n"
        "print(names.get_name('model.layers.0.self_attn.indexer.k_norm.bias', try_suffixes=('.bias',)))\n"
    )
    gguf_py = generate.llama_cpp_source() / "gguf-py"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(gguf_py))
    )
    assert done.returncode == 0 and done.stdout.strip() == "blk.0.indexer.k_norm.bias", done.stderr


def test_minimax01_notes_what_llama_cpp_computes_otherwise_than_transformers():
    """MiniMax-01's conversion notes where llama.cpp's logits differ from transformers' however exact the file: the
    lightning attention's output normed at the config's epsilon (transformers fixes 1e-6), and rope on part of each
    head, as the release's config says and llama.cpp turns it (transformers 5's MiniMax turns the whole head)."""
    from unshard.families.minimax import minimax01_checked

    config = json.loads((SHIPPED / "minimax01-fsdp2" / "reference" / "config.json").read_text())
    assert minimax01_checked(config, Path("config.json")) == []
    eps, turned = minimax01_checked({**config, "rms_norm_eps": 1e-5, "rotary_dim": 8}, Path("config.json"))
    assert "at the config's rms_norm_eps (1e-05), where transformers norms it at 1e-06" in eps
    assert turned.startswith("rope turns 8 of each head's 16 dimensions, as the config says")
