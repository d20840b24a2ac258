"""The family registry: every family declares every part (a value, or Unsupported with its reason), each path
reads its part through the registry, and `unshard families` tells the truth: where it says no, the path refuses
with the reason it shows; where it says yes, a shipped fixture of the family goes down that path in the tests."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from conftest import SHIPPED
from test_cli_and_errors import run_cli

from unshard import families
from unshard.errors import CheckpointError, ConfigMismatchError, UnshardError
from unshard.families.parts import Family, GGUFPart, MegatronRules, MmprojPart, MoELayout, Unsupported
from unshard.names.dense_tables import TensorTable
from unshard.sources import megatron_hf

# What each part holds when the family has it
KINDS = {
    "tensors": TensorTable,
    "megatron": MegatronRules,
    "meta_names": dict,
    "fused_siblings": tuple,
    "gguf": GGUFPart,
    "mmproj": MmprojPart,
    "moe_layout": MoELayout,
    "torchtitan_names": dict,
    "torchtune_names": dict,
}


def test_every_family_declares_every_part():
    # (besides the parts: what names the family (`also`: its other classes), the notes, `linearized`, a hook of the
    # --quantize path, whose part is fused_siblings, that families with fused parameters on disk set, and `hub_names`
    # and `hub_renames`, how its folder is named)
    besides = ("name", "model_type", "architecture", "also", "notes", "linearized", "hub_names", "hub_renames")
    parts = [f.name for f in dataclasses.fields(Family) if f.name not in besides]
    assert set(parts) == set(KINDS), "a new part needs its kind here, and a column in families.PATHS if it is a path"
    derived = {name for name, value in vars(Family).items() if isinstance(value, property)}  # (megatron_out)
    assert {part for _, part in families.PATHS.values() if part} <= set(parts) | derived
    for family in families.FAMILIES:
        for part in parts:
            value = getattr(family, part)
            assert isinstance(value, (KINDS[part], Unsupported)), (family.name, part, value)
            if isinstance(value, Unsupported):
                assert value.reason and "\n" not in value.reason, (family.name, part)
        assert set(family.notes) <= set(families.PATHS), family.name
    assert len({f.model_type for f in families.FAMILIES}) == len(families.FAMILIES)
    named = [name for f in families.FAMILIES for name in (f.architecture, *f.also)]
    assert len(set(named)) == len(named)


def test_tables_name_the_family_class():
    for family in families.FAMILIES:
        if isinstance(family.tensors, TensorTable):
            assert family.tensors.architecture == family.architecture


def test_tables_are_of_models_transformers_loads_in_one_dtype():
    """A table names tensors without building the model, so it cannot learn which ones transformers keeps in
    float32 beside 16-bit weights (model_facts.ModelFacts.float32): its families must have none."""
    transformers = pytest.importorskip("transformers")
    for family in families.FAMILIES:
        if isinstance(family.tensors, TensorTable):
            model_class = getattr(transformers, family.tensors.architecture)
            assert not model_class._keep_in_fp32_modules_strict, family.model_type
            assert not model_class._keep_in_fp32_modules, family.model_type


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.model_type)
def test_megatron_refuses_with_the_reason_it_shows(family):
    if families.supports(family, "megatron"):
        assert megatron_hf.family_of(family.model_type, "ckpt") is family
        wants = family.megatron.signature
        if wants is not None:  # Megatron-LM's args that describe this family (with either value where it is None)
            for either in (False, True):
                said = {name: either if value is None else value for name, value in dataclasses.asdict(wants).items()}
                args = {
                    "swiglu": True,
                    "add_qkv_bias": said["qkv_bias"],
                    "qk_layernorm": said["qk_norm"],
                    "num_experts": 4 if said["experts"] else None,
                    "moe_shared_expert_intermediate_size": 16 if said["shared_experts"] else None,
                    "moe_router_score_function": "sigmoid" if said["sigmoid_router"] else "softmax",
                    "multi_latent_attention": said["latent_attention"],
                    "rotary_percent": 0.5 if said["partial_rotary"] else 1.0,
                    "add_bias_linear": said["linear_bias"],
                    "softmax_type": "learnable" if said["attention_sinks"] else "vanilla",
                    "quick_geglu": said["activation"] == "quick_geglu",
                }
                assert megatron_hf.model_type_from_args(args, "ckpt") == family.model_type
    else:
        with pytest.raises(
            CheckpointError,
            match=re.escape(f"ckpt: {family.name} from Megatron is not supported: {family.megatron.reason}"),
        ):
            megatron_hf.family_of(family.model_type, "ckpt")
    with pytest.raises(
        CheckpointError,
        match="no Megatron name table for model_type 'rwkv'; unshard knows deepseek_v2, deepseek_v3, ",
    ):
        megatron_hf.family_of("rwkv", "ckpt")


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.model_type)
def test_gguf_refuses_with_the_reason_it_shows(family, tmp_path):
    from unshard.sinks.gguf.plan import plan_gguf

    if families.supports(family, "gguf"):
        return  # (the families written: test_gguf, each against llama.cpp's converter)
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": [family.architecture], "model_type": family.model_type})
    )
    with pytest.raises(
        ConfigMismatchError,
        match=re.escape(
            f"{family.architecture} is not an architecture unshard writes as GGUF yet ({family.gguf.reason}"
        ),
    ):
        plan_gguf("f16", [], tmp_path, "float32")


def test_torchtitan_names_of_a_family_without_them_are_refused(tmp_path):
    """torchtitan's Meta names under a Mixtral config: the family has no torchtitan table, which the error says."""
    config = tmp_path / "mixtral"
    config.mkdir()
    (config / "config.json").write_text(
        json.dumps(
            {
                "model_type": "mixtral",
                "architectures": ["MixtralForCausalLM"],
                "num_attention_heads": 4,
                "hidden_size": 64,
            }
        )
    )
    src = next((SHIPPED / "torchtitan-llama3-fsdp2").glob("**/.metadata")).parent
    code, _, err = run_cli("inspect", src, "--config-from", config)
    reason = families.by_model_type("mixtral").meta_names.reason
    assert code == 1 and f"torchtitan's names of model_type 'mixtral': {reason}" in err


def test_merge_moe_makes_the_layouts_the_registry_declares():
    from unshard.merging import moe

    layouts = families.moe_layouts()
    assert [layout.name for layout in layouts] == ["Mixtral", "Qwen MoE", "Qwen3 MoE"]  # (Mixtral first, as mergekit)
    assert [layout.architecture for layout in layouts] == [f.architecture for f in families.with_part("moe_layout")]
    recipe = moe.MoERecipe("base", [moe.Expert("a", ("x",), (), None, None)] * 2, [], "random", None, 2, None, "")
    with pytest.raises(
        UnshardError, match="no MoE architecture takes these models .*Mixtral is made from llama or mistral models"
    ):
        moe._layout(recipe, {"base": "gemma"}, "recipe.yaml")


def test_unshard_families_prints_the_matrix():
    code, out, _ = run_cli("families", "--json")
    assert code == 0 and json.loads(out) == families.matrix()
    rows = {row["model_type"]: row for row in json.loads(out)}
    mllama = families.by_model_type("mllama").gguf.reason  # (llama.cpp converts none: not applicable)
    assert rows["llama"]["gguf"] == "yes" and rows["mllama"]["gguf"] == f"n/a: {mllama}"
    assert rows["llama"]["mmproj"].startswith("n/a: ")
    code, out, _ = run_cli("families")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:2] == ["family", "model_type"]
    for family in families.FAMILIES:
        assert any(line.startswith(family.name + " ") for line in lines[1 : len(families.FAMILIES) + 1])
        for part in ("megatron", "meta_names", "gguf", "mmproj"):
            value = getattr(family, part)
            if isinstance(value, Unsupported) and value.applies:
                assert value.reason in out, (family.name, part)


# Each "yes" of the matrix, and the shipped fixture that takes the family down that path in the tests
# (test_megatron, test_meta_llama, test_gguf). Mistral goes down them by Llama's own declarations (SHARED).
# The families unshard knows for GGUF alone (parts.multimodal_family) whose text model and towers both files take
GGUF_MULTIMODAL = {
    "smolvlm": "smolvlm-fsdp2",
    "glm_ocr": "glmocr-fsdp2",
    "qwen2_audio": "qwen2audio-fsdp2",
    "audioflamingo3": "audioflamingo3-fsdp2",
    "qwen3_asr": "qwen3asr-fsdp2",
    "qwen3_omni_moe": "qwen3omni-fsdp2",
    "qwen2_5_omni": "qwen25omni-fsdp2",
    "granite_speech": "granitespeech-fsdp2",
    "granite_speech_plus": "granitespeechplus-fsdp2",
    "llava": "llava-pixtral-fsdp2",
    "janus": "janus-fsdp2",
    "hunyuan_vl": "hunyuanocr-fsdp2",
    "paddleocr_vl": "paddleocr-fsdp2-spm",
    "internvl": "internvl-fsdp2",
    "lfm2_vl": "lfm2vl-fsdp2",
    "lighton_ocr": "lightonocr-fsdp2",
    "unlimited_ocr": "unlimitedocr-fsdp2",
    "deepseek_ocr2": "deepseekocr2-fsdp2",  # (its towers with llama.cpp's gguf-py)
    "granite4_vision": "granite4vision-fsdp2",  # (its towers with llama.cpp's gguf-py)
}
TESTED = {
    "megatron_legacy": {
        "llama": "megatron-llama-tp2-pp2-vpp2",
        "qwen2": "megatron-qwen2-tp2-pp2",
        "qwen3": "megatron-qwen3-tp2-dp2",
        "mixtral": "megatron-mixtral-tp2-pp2-ep2",
        "qwen2_moe": "megatron-qwen2moe-tp2-pp2-ep2",
        "qwen3_moe": "megatron-qwen3moe-pp2-ep2-dp2",
        "deepseek_v3": "megatron-deepseekv3-tp2-pp2-ep2",
        "deepseek_v2": "megatron-deepseekv2-tp2-pp2-ep2",
        # (DeepSeek-V3's and Qwen2's checkpoints read with GLM-4.7-Flash's and Seed-OSS's configs: test_megatron)
        "glm4_moe_lite": "megatron-deepseekv3-tp2-pp2-ep2",
        "seed_oss": "megatron-qwen2-tp2-pp2",
        "glm4_moe": "megatron-glm45-tp2-ep2-dp2",
        "solar_open": "megatron-solaropen-tp2-pp2-ep2",
        "gpt_oss": "megatron-gptoss-tp2-pp2-ep2",
    },
    "meta_names": {
        "llama": "torchtitan-llama3-fsdp2",
        "qwen3": "torchtitan-qwen3-fsdp2",
        "qwen3_moe": "torchtitan-qwen3moe-fsdp2",
        "deepseek_v3": "torchtitan-deepseekv3-fsdp2",
        "gpt_oss": "torchtitan-gptoss-fsdp2",
        "qwen3_5": "torchtitan-qwen35-fsdp2",
        "qwen3_5_moe": "torchtitan-qwen35moe-fsdp2",
        "muse_glimmer": "torchtitan-museglimmer-fsdp2",
        "kimi_k25": "torchtitan-kimik25-fsdp2",
        "qwen2": "torchtune-qwen2-fsdp2",
        "gemma": "torchtune-gemma-fsdp2",
        "gemma2": "torchtune-gemma2-fsdp2",
        "phi3": "torchtune-phi3-fsdp2",
        "mllama": "torchtune-llama32vision-fsdp2",
    },
    # (test_way_back writes them back into Megatron and megatron-core loads them)
    "to_megatron": {
        "llama": "megatron-llama-tp2-pp2-vpp2",
        "qwen2": "megatron-qwen2-tp2-pp2",
        "qwen3": "megatron-qwen3-tp2-dp2",
        "mixtral": "megatron-mixtral-tp2-pp2-ep2",
        "qwen2_moe": "megatron-qwen2moe-tp2-pp2-ep2",
        "qwen3_moe": "megatron-qwen3moe-pp2-ep2-dp2",
        "glm4_moe": "megatron-glm45-tp2-ep2-dp2",
        "solar_open": "megatron-solaropen-tp2-pp2-ep2",
        "deepseek_v3": "megatron-deepseekv3-tp2-pp2-ep2",
        "deepseek_v2": "megatron-deepseekv2-tp2-pp2-ep2",
        "gpt_oss": "megatron-gptoss-tp2-pp2-ep2",
    },
    # (test_way_back writes torchtitan's names from these fixtures' models and loads them in torchtitan)
    "to_torchtitan": {
        "llama": "torchtitan-llama3-fsdp2",
        "qwen3": "torchtitan-qwen3-fsdp2",
        "qwen3_moe": "torchtitan-qwen3moe-fsdp2",
        "deepseek_v3": "torchtitan-deepseekv3-fsdp2",
        "gpt_oss": "torchtitan-gptoss-fsdp2",
        "qwen3_5": "torchtitan-qwen35-fsdp2",
        "qwen3_5_moe": "torchtitan-qwen35moe-fsdp2",
        "muse_glimmer": "torchtitan-museglimmer-fsdp2",
        "kimi_k25": "torchtitan-kimik25-fsdp2",
    },
    # (test_way_back writes torchtune's names from these fixtures' models and loads them in torchtune)
    "to_torchtune": {
        "llama": "torchtune-llama3-fsdp2",
        "qwen2": "torchtune-qwen2-fsdp2",
        "gemma": "torchtune-gemma-fsdp2",
        "gemma2": "torchtune-gemma2-fsdp2",
        "phi3": "torchtune-phi3-fsdp2",
        "mllama": "torchtune-llama32vision-fsdp2",
    },
    "gguf": {
        "llama": "llama-fsdp2-spm",
        **GGUF_MULTIMODAL,
        "voxtral": "voxtral-fsdp2",  # (its text model's file alone: no mmproj)
        "chameleon": "chameleon-fsdp2",  # (its text model's file alone: no mmproj)
        "muse_glimmer": "torchtitan-museglimmer-fsdp2",  # (its text model's file alone, with llama.cpp's gguf-py)
        "bert": "bert-fsdp2",
        "roberta": "roberta-fsdp2",
        "xlm-roberta": "xlmroberta-fsdp2",
        "camembert": "camembert-fsdp2",
        "t5": "t5-fsdp2",
        "distilbert": "distilbert-fsdp2",
        "modernbert": "modernbert-fsdp2",
        "eurobert": "eurobert-fsdp2",
        "qwen2": "qwen2-fsdp2-spm",
        "qwen3": "qwen3-fsdp2-spm",
        "gemma": "gemma-fsdp2-spm",
        "gemma2": "gemma2-fsdp2-spm",
        "gemma3_text": "gemma3-fsdp2-spm",
        "gemma3": "gemma3vl-fsdp2-spm",
        "gemma3n_text": "gemma3n-fsdp2-spm",
        "gemma3n": "gemma3nvl-fsdp2-spm",
        "gemma4_text": "gemma4-fsdp2",
        "gemma4": "gemma4vl-fsdp2",
        "gemma4_unified": "gemma4unified-fsdp2",
        "gemma4_assistant": "gemma4assistant-fsdp2",
        "muse_glimmer_assistant": "museglimmerassistant-fsdp2",
        "eagle3": "speculators-eagle3-fsdp2",  # (with llama.cpp's gguf-py; the target's folder beside it)
        "dspark": "speculators-dspark-fsdp2",  # (the same)
        "rwkv7": "rwkv7-fsdp2-dcp",  # (its hf folder as --config-from)
        "internlm2": "internlm2-fsdp2-dcp",  # (the same)
        "gemma4_unified_assistant": "gemma4unifiedassistant-fsdp2",
        "phi3": "phi3-fsdp2-spm",
        "mixtral": "mixtral8-fsdp2-spm",
        "qwen2_moe": "qwen2moe-fsdp2",
        "qwen3_moe": "qwen3moe-fsdp2",
        "qwen3_next": "qwen3next-fsdp2",
        "qwen3_5_text": "qwen35-fsdp2",
        "qwen3_5_moe_text": "qwen35moe-fsdp2",
        "olmo2": "olmo2-fsdp2",
        "olmo3": "olmo3-fsdp2",
        "smollm3": "smollm3-fsdp2",
        "gpt_oss": "gptoss-fsdp2",
        "seed_oss": "seedoss-fsdp2",
        "ernie4_5": "ernie45-fsdp2-spm",
        "granite": "granite-fsdp2",
        "granite_swa": "graniteswa-fsdp2",  # (with llama.cpp's gguf-py)
        "granitemoe_swa": "granitemoeswa-fsdp2",  # (with llama.cpp's gguf-py)
        "mellum": "mellum-fsdp2",  # (with llama.cpp's gguf-py)
        "cohere2_moe": "cohere2moe-fsdp2",  # (with llama.cpp's gguf-py)
        "deepseek_v32": "deepseekv32-fsdp2",  # (with llama.cpp's gguf-py)
        "hy_v3": "hyv3-fsdp2",  # (with llama.cpp's gguf-py)
        "laguna": "laguna-fsdp2",  # (with llama.cpp's gguf-py)
        "hrm_text": "hrmtext-fsdp2",  # (with llama.cpp's gguf-py)
        "kimi_k25": "torchtitan-kimik25-fsdp2",  # (with a tokenizer beside)
        "dots3_note": "dots3notevl-fsdp2",  # (with llama.cpp's gguf-py)
        "glm5_next": "glm5next-fsdp2",  # (with llama.cpp's gguf-py)
        "dots3_note_text": "dots3note-fsdp2",  # (with llama.cpp's gguf-py)
        "minimax_m3_vl": "minimaxm3-fsdp2",  # (with llama.cpp's gguf-py)
        "minimax": "minimax01-fsdp2",  # (with llama.cpp's gguf-py)
        "bailing_hybrid": "ling3-fsdp2",  # (with llama.cpp's gguf-py)
        "mimo_v2_flash": "mimov2flash-fsdp2",
        "nomic_bert": "nomicbert-fsdp2",
        "hy_v4": "hyv4-fsdp2",  # (with llama.cpp's gguf-py)
        "step3p7": "step3p7-fsdp2",  # (with llama.cpp's gguf-py)
        "qwen4_exp_text": "qwen4exp-fsdp2",  # (with llama.cpp's gguf-py)
        "arcee": "arcee-fsdp2",
        "exaone": "exaone-fsdp2",
        "internlm3": "internlm3-fsdp2-spm",
        "sarvam_moe": "sarvammoe-fsdp2",
        "exaone4": "exaone4-fsdp2",
        "exaone_moe": "exaonemoe-fsdp2",
        "stablelm": "stablelm-fsdp2",
        "starcoder2": "starcoder2-fsdp2",
        "cohere": "cohere-fsdp2",
        "olmo": "olmo-fsdp2",
        "nemotron": "nemotron-fsdp2-spm",
        "glm4": "glm4-fsdp2",
        "glm": "glm-fsdp2",
        "gpt_neox": "gptneox-fsdp2",
        "falcon": "falcon-fsdp2",
        "phi": "phi2-fsdp2",
        "gpt2": "gpt2-fsdp2",
        "bloom": "bloom-fsdp2",
        "mpt": "mpt-fsdp2",
        "apertus": "apertus-fsdp2",
        "deepseek_v2": "deepseekv2-fsdp2",
        "youtu": "youtu-fsdp2",
        "ministral3": "ministral3-fsdp2",
        "lfm2_moe": "lfm2moe-fsdp2",
        "glm4v": "glm4v-fsdp2",
        "glm4v_moe": "glm4vmoe-fsdp2",
        "llama4": "llama4-fsdp2",
        "llama4_text": "llama4text-fsdp2",
        "dbrx": "dbrx-fsdp2",
        "mamba2": "mamba2-fsdp2",
        "falcon_h1": "falconh1-fsdp2",
        "mamba": "mamba-fsdp2",
        "falcon_mamba": "falconmamba-fsdp2",
        "jamba": "jamba-fsdp2-spm",
        "minicpm3": "minicpm3-fsdp2-spm",
        "glm_moe_dsa": "glm5-fsdp2",
        "exaone4_5": "exaone45-fsdp2",
        "mistral3": "mistral3-fsdp2",
        "gpt_bigcode": "starcoder-fsdp2",
        "olmoe": "olmoe-fsdp2",
        "granitemoe": "granitemoe-fsdp2",
        "ernie4_5_moe": "ernie45moe-fsdp2-spm",
        "dots1": "dots1-fsdp2",
        "glm4_moe_lite": "glm47flash-fsdp2",
        "minimax_m2": "minimax-m2-fsdp2",
        "cohere2": "cohere2-fsdp2",
        "solar_open": "solaropen-fsdp2",
        "granitemoeshared": "granitemoeshared-fsdp2",
        "granitemoehybrid": "granitehybrid-fsdp2",
        "bamba": "bamba-fsdp2",
        "nemotron_h": "nemotronh-fsdp2",
        "hunyuan_v1_dense": "hunyuan-fsdp2",
        "hunyuan_v1_moe": "hunyuanmoe-fsdp2",
        "afmoe": "afmoe-fsdp2",
        "jais2": "jais2-fsdp2",
        "lfm2": "lfm2-fsdp2",
        "kimi_linear": "kimilinear-fsdp2",
        "deepseek_v3": "megatron-deepseekv3-tp2-pp2-ep2",  # (and models transformers writes, in test_gguf)
        "glm4_moe": "megatron-glm45-tp2-ep2-dp2",
        "qwen2_vl": "qwen2vl-fsdp2",
        "qwen2_5_vl": "qwen25vl-fsdp2",
        "qwen3_vl": "qwen3vl-fsdp2",
        "qwen3_vl_moe": "qwen3vlmoe-fsdp2",
        "qwen3_5": "qwen35vl-fsdp2",
        "minicpmv4_6": "minicpmv46-fsdp2",
        "qwen3_5_moe": "qwen35moevl-fsdp2",
        "qwen4_exp": "qwen4expvl-fsdp2",  # (with llama.cpp's gguf-py)
    },
    "mmproj": {
        "gemma3": "gemma3vl-fsdp2-spm",
        "exaone4_5": "exaone45-fsdp2",  # (with llama.cpp's gguf-py)
        "minimax_m3_vl": "minimaxm3-fsdp2",  # (with llama.cpp's gguf-py)
        "glm5_next": "glm5next-fsdp2",  # (with llama.cpp's gguf-py)
        "dots3_note": "dots3notevl-fsdp2",  # (with llama.cpp's gguf-py)
        "minicpmv4_6": "minicpmv46-fsdp2",  # (with llama.cpp's gguf-py)
        "glm4v": "glm4v-fsdp2",
        "glm4v_moe": "glm4vmoe-fsdp2",
        "gemma4": "gemma4vl-fsdp2",
        "gemma3n": "gemma3nvl-fsdp2-spm",  # (timm from the torchvision peer venv)
        "gemma4_unified": "gemma4unified-fsdp2",  # (with llama.cpp's gguf-py)
        "kimi_k25": "torchtitan-kimik25-fsdp2",  # (its hf folder as --config-from)
        "muse_glimmer": "torchtitan-museglimmer-fsdp2",  # (the same; with llama.cpp's gguf-py)
        "mistral3": "mistral3-fsdp2",
        "llama4": "llama4-fsdp2",
        **GGUF_MULTIMODAL,
        "qwen2_vl": "qwen2vl-fsdp2",
        "qwen2_5_vl": "qwen25vl-fsdp2",
        "qwen3_vl": "qwen3vl-fsdp2",
        "qwen3_vl_moe": "qwen3vlmoe-fsdp2",
        "qwen3_5": "qwen35vl-fsdp2",
        "qwen3_5_moe": "qwen35moevl-fsdp2",
        "qwen4_exp": "qwen4expvl-fsdp2",  # (with llama.cpp's gguf-py)
    },
}
SHARED = {"mistral": "llama", "idefics3": "smolvlm", "mt5": "t5", "umt5": "t5"}


def _declaration(family, part):
    value = getattr(family, part)
    return value.rules if isinstance(value, MegatronRules) else value


@pytest.mark.parametrize("path", TESTED)
def test_every_yes_has_a_fixture_that_takes_it(path):
    part = families.PATHS[path][1]
    said = {f.model_type for f in families.with_part(part)}
    for model_type, like in SHARED.items():
        if model_type in said:
            same = _declaration(families.by_model_type(model_type), part)
            assert same is _declaration(families.by_model_type(like), part), (model_type, path)
            said.remove(model_type)
    assert set(TESTED[path]) == said
    for fixture in TESTED[path].values():
        assert (SHIPPED / fixture).is_dir(), fixture


def test_the_docs_show_the_matrix_as_it_is():
    """The docs' copy of `unshard families` is the table the registry makes now, and the README names the families it
    lists, in its order."""
    from conftest import ROOT

    from unshard.report import families_table

    text = (ROOT / "docs" / "families.md").read_text()
    shown = text.split("# Model families", 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert shown.rstrip("\n") == families_table(families.matrix(), families.PATHS).split("\n\n")[0]
    readme = (ROOT / "README.md").read_text().split("The families it knows:\n\n", 1)[1].split("\n\n", 1)[0]
    assert readme.replace("\n", " ") == ", ".join(row["family"] for row in families.matrix()) + "."


def test_inspect_names_the_family_and_the_paths_it_takes():
    """`unshard inspect` says which family the config is and which paths take it, as `unshard families` says; a model
    type the registry lacks is named so, with what still takes it."""
    from unshard.report import family_paths

    code, out, _ = run_cli("inspect", SHIPPED / "qwen3vlmoe-fsdp2" / "global_step_1")
    lines = out.splitlines()
    at = lines.index("family       Qwen3-VL-MoE (qwen3_vl_moe)")
    assert code == 0 and lines[at + 1].split(None, 1)[1] == "FSDP/DCP/DeepSpeed, --quantize, GGUF, GGUF mmproj"
    assert lines[at + 2].startswith("  not yet         Megatron torch, Megatron torch_dist, to Megatron")
    code, out, _ = run_cli("inspect", "--json", SHIPPED / "llama-fsdp2" / "global_step_1")
    assert code == 0 and json.loads(out)["family"]["paths"]["gguf"] == "yes"
    assert family_paths("some_new_model") == {"name": None, "model_type": "some_new_model"}
