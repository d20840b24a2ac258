"""GGUF output: one file for llama.cpp, written straight from the shards, equal to llama.cpp's own converter's.

The oracle is `convert_hf_to_gguf.py` as llama-cpp-python's source package on PyPI vendors it (with its
gguf-py), run in its own venv (generate.PEERS["llamacpp"], generate.llama_cpp_source) on the folder unshard
writes without GGUF, which the other tests check bit for bit against the training model. The two files are
compared through gguf-py's reader: every tensor (name, type, shape, bytes, order) and every metadata field
but those naming the file or the tool (NAMING).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import generate
import gguf
import pytest
import torch
import yaml
from conftest import SHIPPED
from safetensors import safe_open
from test_cli_and_errors import leftovers, run_cli

import unshard
from unshard.errors import UnshardError
from unshard.report import human_bytes
from unshard.sinks.gguf import kquants
from unshard.types import OutputOptions

TYPES = ["f32", "f16", "bf16", "q8_0", "auto"]
# The converter names the file after the folder it read, and takes tags from the model card there (a merged
# folder's card is tagged `merge`, `unshard`): fields naming the file or the tool.
NAMING = {"general.name", "general.tags"}


@pytest.fixture(scope="session")
def converter(tmp_path_factory):
    """Runs llama.cpp's convert_hf_to_gguf.py on a Hugging Face folder, in one process kept for the session
    (llama_cpp_converter.py), its log in a file."""
    root, python = generate.llama_cpp_source(), generate.peer_python("llamacpp")
    log = tmp_path_factory.mktemp("converter") / "converter.log"
    server: list[subprocess.Popen] = []  # (started by the first run, and again if it died)

    def run(
        folder: Path,
        outtype: str,
        out: Path,
        pre: str | None = None,
        mmproj: bool = False,
        more: tuple = (),
        gpt2_vocab: tuple[str, ...] = (),
    ) -> Path:
        """pre: the BPE pre-tokenizer's name, given to the converter for a tokenizer trained by the fixtures, which
        its table of known tokenizers' hashes lacks. mmproj: write a vision-language model's vision part (its
        --mmproj) rather than its text model. more: its other arguments. gpt2_vocab: converter classes ("module.Class")
        that read tokenizer.json as any byte-level BPE, where they read a vocabulary through its makers' code alone."""
        if not server or server[0].poll() is not None:
            server[:] = [
                subprocess.Popen(
                    [str(python), str(Path(__file__).parent / "llama_cpp_converter.py"), str(root)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log.open("a"),
                    text=True,
                    env=dict(os.environ, HF_HUB_OFFLINE="1"),
                )
            ]
        args = [str(folder), "--outtype", outtype, "--outfile", str(out), *(["--mmproj"] if mmproj else []), *more]
        job = {"pre": pre, "args": list(map(str, args)), "gpt2_vocab": list(gpt2_vocab)}
        server[0].stdin.write(json.dumps(job) + "\n")
        server[0].stdin.flush()
        reply = server[0].stdout.readline()
        assert reply, log.read_text()[-3000:]
        done = json.loads(reply)
        assert done["ok"], done["error"] + "\n" + log.read_text()[-3000:]
        return out

    yield run
    if server:
        server[0].stdin.close()
        server[0].wait(timeout=60)


def for_the_converter(folder: Path) -> str | None:
    """The pre-tokenizer's name to give the converter for a folder's tokenizer: None for a SentencePiece model,
    GPT-2's for the fixtures' trained byte-level BPE, whose tokenizer_config.json then names the class transformers 4
    (the converter's venv) knows for it, without transformers 5's list of extra special tokens, which transformers 4
    rejects (they are added tokens of tokenizer.json all the same)."""
    import json

    if (folder / "tokenizer.model").is_file():
        return None
    config = json.loads((folder / "tokenizer_config.json").read_text())
    if isinstance(config.get("extra_special_tokens"), list):
        config.pop("extra_special_tokens")
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"}))
    return "gpt-2"


class Reader(gguf.GGUFReader):
    """gguf-py's reader, each array of numbers read as one part rather than number by number (which takes it 9 s for
    the 240 KB normalizer table of XLM-RoBERTa's and T5's files); its fields' contents() are the same lists."""

    def _get_field_parts(self, orig_offs, raw_type):
        import numpy as np

        item = self._get(orig_offs, np.uint32) if raw_type == gguf.GGUFValueType.ARRAY else None
        number = item is not None and self.gguf_scalar_to_np.get(gguf.GGUFValueType(int(item[0])))
        if not number:
            return super()._get_field_parts(orig_offs, raw_type)
        count = self._get(orig_offs + 4, np.uint64)
        values = self._get(orig_offs + 12, number, int(count[0]))
        types = [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType(int(item[0]))]
        return 12 + int(values.nbytes), [item, count, values], [2], types


def contents(path: Path) -> tuple[dict, list]:
    """(metadata fields, [(tensor name, type, shape, bytes)] in file order), as gguf-py reads them."""
    reader = Reader(path)
    fields = {
        key: field.contents()
        for key, field in reader.fields.items()
        if not key.startswith("GGUF.") and key not in NAMING
    }
    tensors = [(t.name, t.tensor_type.name, t.shape.tolist(), t.data.tobytes()) for t in reader.tensors]
    return fields, tensors


def assert_same_file(ours: Path, theirs: Path) -> None:
    mine, expected = contents(ours), contents(theirs)
    assert mine[0] == expected[0] and list(mine[0]) == list(expected[0])  # (the same fields, in the same order)
    assert [t[:3] for t in mine[1]] == [t[:3] for t in expected[1]]
    for a, b in zip(mine[1], expected[1]):
        assert a[3] == b[3], a[0]


def test_each_type_as_llama_cpp_converter_writes_it(converter, tmp_path):
    """A bf16 Llama (FSDP2 rank files, 2 ranks) with a SentencePiece tokenizer, in every type the converter
    writes; --verify reads each file back. q and k are reordered per head as llama.cpp wants them, the
    vocabulary is the tokenizer.model's with the config's size, special tokens and chat template."""
    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    for kind in TYPES:
        ours = tmp_path / f"{kind}.gguf"
        result = unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert result.files == ["model.gguf"] and ours.is_file() and not leftovers(tmp_path)
        assert_same_file(ours, converter(tmp_path / "hf", kind, tmp_path / f"oracle-{kind}.gguf"))
    fields, tensors = contents(tmp_path / "q8_0.gguf")
    assert fields["tokenizer.ggml.model"] == "llama" and len(fields["tokenizer.ggml.tokens"]) == 103
    assert "tokenizer.chat_template" in fields
    assert {t[1] for t in tensors} == {"Q8_0", "F32"}
    assert contents(tmp_path / "auto.gguf")[0]["general.file_type"] == gguf.LlamaFileType.MOSTLY_BF16


def test_added_tokens_take_the_converter_types(converter, tmp_path):
    """Tokens tokenizer_config.json adds over the SentencePiece vocabulary: special ones are control tokens,
    others user-defined (with SentencePiece's space marker read as a space), unless they look special to the
    converter (<|...|>, gemma's <unused...>); <think> and [INST] do not."""
    import json

    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config_path = tmp_path / "hf" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    added = {
        96: ("<think>", False),
        97: ("<|im_end|>", False),
        98: ("<unused0>", False),
        99: ("[INST]", False),
        100: ("\u2581hi", False),
        101: ("<tool>", True),
    }
    config["added_tokens_decoder"] = {
        **config.get("added_tokens_decoder", {}),
        **{
            str(i): {
                "content": text,
                "special": special,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "single_word": False,
            }
            for i, (text, special) in added.items()
        },
    }
    config_path.write_text(json.dumps(config))
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
    assert code == 0, err
    assert_same_file(tmp_path / "m.gguf", converter(tmp_path / "hf", "auto", tmp_path / "oracle.gguf"))
    fields = contents(tmp_path / "m.gguf")[0]
    kinds = {fields["tokenizer.ggml.tokens"][i]: fields["tokenizer.ggml.token_type"][i] for i in added}
    assert kinds == {"<think>": 4, "<|im_end|>": 3, "<unused0>": 3, "[INST]": 4, " hi": 4, "<tool>": 3}


def test_transformers_reads_the_same_model_back(tmp_path):
    """transformers' GGUF loader (which undoes llama.cpp's q/k order) gives the training model's logits exactly
    from f32, f16 and bf16 (the model is bf16), and close from q8_0 (measured: relative distance 0.013, max abs
    difference 0.026 of logits up to 1.8), with the same greedy tokens."""
    from transformers import AutoModelForCausalLM

    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    ids = torch.tensor([[1, 5, 20, 33, 64, 70, 90, 2]])
    expected = reference(ids).logits
    for kind, tolerance in (("f32", 0.0), ("f16", 0.0), ("bf16", 0.0), ("q8_0", 0.03)):
        unshard.convert(src, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        model = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=f"{kind}.gguf", dtype=torch.float32)
        logits = model(ids).logits
        distance = ((logits - expected).norm() / expected.norm()).item()
        assert distance <= tolerance and torch.equal(logits.argmax(-1), expected.argmax(-1)), (kind, distance)
    assert distance > 0  # (q8_0 does round)


# llama.cpp's logits against transformers' on the unsharded model, relative distance (measured on the ten
# families: f32 4e-5 to 7e-4, f16 2e-4 to 1e-3, bf16 1.3e-3 to 6e-3, q8_0 7e-3 to 0.032)
LLAMA_CPP_TOLERANCE = {"f32": 1e-3, "f16": 2e-3, "bf16": 1e-2, "q8_0": 0.05}
# gpt-oss's q8_0: its 8-bit experts turn a router's near tie of this tiny random model (measured 0.063; f32 2e-4)
Q8_0_TOLERANCE = {"gptoss-fsdp2": 0.08}


def llama_cpp_client(*args, kv_cache: str = "f16", flash_attn: bool = False, non_causal: bool = False) -> None:
    """tests/llama_cpp_client.py, run by llama.cpp itself: llama-cpp-python compiled from its source package
    (a peer venv); kv_cache: the type its keys and values are cached in; flash_attn: flash attention on (MiniMax-M3's
    sparse attention runs with it alone); non_causal: embeddings of tokens that attend to every other."""
    done = subprocess.run(
        [
            str(generate.peer_python("llamacpp-client")),
            str(Path(__file__).parent / "llama_cpp_client.py"),
            *map(str, args),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, KV_CACHE=kv_cache, FLASH_ATTN=str(int(flash_attn)), NON_CAUSAL=str(int(non_causal))),
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="session")
def llama_cpp():
    """Runs a GGUF file through llama.cpp: the prompt's logits and its greedy continuation."""
    import numpy as np

    def run(
        gguf_file: Path,
        prompt: list[int],
        new: int,
        lora: Path | None = None,
        kv_cache: str = "f16",
        flash_attn: bool = False,
    ) -> tuple[torch.Tensor, list[int]]:
        """lora: an adapter file llama.cpp applies to the model; kv_cache: the type llama.cpp caches keys and values
        in (its default f16 is further from a tiny random model's attention than f32's tolerance where the scores
        are not scaled: Gemma 4's); flash_attn: flash attention on."""
        out = gguf_file.with_name(gguf_file.stem + ("-with-" + lora.stem if lora else "") + ".npz")
        client_args = ("run", gguf_file, ",".join(map(str, prompt)), out, new, *([lora] if lora else []))
        llama_cpp_client(*client_args, kv_cache=kv_cache, flash_attn=flash_attn)
        with np.load(out) as saved:
            return torch.from_numpy(saved["logits"]), saved["greedy"].tolist()

    return run


@pytest.fixture(scope="session")
def ggml_library() -> str:
    """llama.cpp's libggml-base, as llama-cpp-python (the llamacpp-client peer venv) ships it: the K-quants' kernels
    (kquants.py), given to unshard by UNSHARD_GGML_LIBRARY."""
    python = generate.peer_python("llamacpp-client")
    (library,) = python.parent.parent.glob("lib/python3*/site-packages/llama_cpp/lib/libggml-base.so")
    return str(library)


@pytest.mark.parametrize(
    "case", ["llama-fsdp2-spm", "qwen2-fsdp2-spm", "gemma2-fsdp2-spm", "mixtral8-fsdp2-spm", "qwen2moe-fsdp2"]
)
def test_llama_quantize_types_as_it_makes_them_from_the_converter_s_file(
    case, converter, llama_cpp, ggml_library, monkeypatch, tmp_path
):
    """q4_0, q4_1, q5_0 and q5_1 equal what llama.cpp's llama-quantize writes from the converter's f32 file with
    `--output-tensor-type q8_0` (its own output type, q6_K, is a K-quant gguf-py cannot compute): every field in
    order, every tensor in its order. The output layer is the embedding where it is tied (Qwen2, Gemma 2), rows
    of 90 fall back to f16; a model of 8 experts keeps attn_k and attn_v in q8_0, every MoE model its routers in f32
    (Qwen2-MoE's shared expert's gate, one row, as a vector). llama.cpp runs each file; on these tiny random models its
    logits' relative distance from the model's measures 0.11-0.28 (4 bits) and 0.04-0.14 (5 bits).
    The K-quant mixes (q2_k ... q6_k, iq4_nl, iq4_xs) equal llama-quantize's own, its q6_K output layer included: on
    Llama's rows of 256 in K-quant blocks (attn_v and ffn_down in q6_K in the blocks where q4_k_m gives them more
    bits), elsewhere in the types of 32-value blocks llama-quantize falls back to."""
    from transformers import AutoModelForCausalLM

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    f32 = converter(tmp_path / "hf", "f32", tmp_path / "converter-f32.gguf", pre=for_the_converter(tmp_path / "hf"))
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)(
        torch.tensor([prompt])
    ).logits[0]
    for kind in ("q4_0", "q4_1", "q5_0", "q5_1"):
        ours, theirs = tmp_path / f"{kind}.gguf", tmp_path / f"llama-quantize-{kind}.gguf"
        unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        llama_cpp_client("quantize", f32, theirs, kind, "q8_0")
        assert_same_file(ours, theirs)
        logits, _ = llama_cpp(ours, prompt, 0)
        distance = ((logits - expected).norm() / expected.norm()).item()
        assert 0 < distance <= (0.35 if kind.startswith("q4") else 0.2), (kind, distance)
    types = {t[0]: t[1] for t in contents(tmp_path / "q4_0.gguf")[1]}
    assert types["output.weight" if "output.weight" in types else "token_embd.weight"] == "Q8_0"
    assert types["blk.0.attn_k.weight"] == ("Q8_0" if case.startswith("mixtral8") else "Q4_0")
    assert types.get("blk.0.ffn_gate_inp.weight", "F32") == "F32"
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    (tmp_path / "llama-quantize").mkdir()
    llama_cpp_client("quantize", f32, tmp_path / "llama-quantize", ",".join(kquants.MIXES))
    for kind in kquants.MIXES:
        unshard.convert(src, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False)
        assert_same_file(tmp_path / f"{kind}.gguf", tmp_path / "llama-quantize" / f"{kind}.gguf")
    if case == "llama-fsdp2-spm":
        types = {t[0]: t[1] for t in contents(tmp_path / "q4_k_m.gguf")[1]}
        assert (types["output.weight"], types["token_embd.weight"], types["blk.0.attn_q.weight"]) == (
            "Q6_K",
            "Q4_K",
            "Q4_K",
        )
        assert (types["blk.0.attn_v.weight"], types["blk.1.attn_v.weight"]) == ("Q4_K", "Q6_K")
        assert types["blk.0.ffn_down.weight"] == "Q5_0"  # (rows of 384)


@pytest.mark.parametrize(
    "case",
    [
        "llama-fsdp2-spm",
        "qwen2-fsdp2-spm",
        "qwen3-fsdp2-spm",
        "gemma-fsdp2-spm",
        "gemma2-fsdp2-spm",
        "gemma3-fsdp2-spm",
        "phi3-fsdp2-spm",
        "mixtral8-fsdp2-spm",
        "qwen2moe-fsdp2",
        "qwen3moe-fsdp2",
        "olmo2-fsdp2",
        "olmo3-fsdp2",
        "smollm3-fsdp2",
        "seedoss-fsdp2",
        "ernie45-fsdp2-spm",
        "gptoss-fsdp2",
    ],
)
def test_llama_cpp_runs_the_file_as_transformers_runs_the_model(case, llama_cpp, tmp_path):
    """llama.cpp itself loads each file and computes the unsharded model's logits, within LLAMA_CPP_TOLERANCE;
    every position's most likely token and 8 greedy tokens are transformers' own, for every type but q8_0,
    whose rounding may turn a near tie of these tiny random models (logits of 0.3) the other way."""
    from transformers import AutoModelForCausalLM

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    prompt, new = [1, 5, 20, 33, 64, 70, 90, 2], 8
    with torch.no_grad():
        expected = model(torch.tensor([prompt])).logits[0]
        sequence = list(prompt)
        for _ in range(new):
            sequence.append(int(model(torch.tensor([sequence])).logits[0, -1].argmax()))
    for kind, tolerance in LLAMA_CPP_TOLERANCE.items():
        gguf_file = tmp_path / f"{kind}.gguf"
        unshard.convert(src, gguf_file, output=unshard.OutputOptions(gguf=kind), progress=False)
        logits, greedy = llama_cpp(gguf_file, prompt, new)
        distance = ((logits - expected).norm() / expected.norm()).item()
        assert distance <= (Q8_0_TOLERANCE.get(case, tolerance) if kind == "q8_0" else tolerance), (kind, distance)
        if kind != "q8_0":
            assert torch.equal(logits.argmax(-1), expected.argmax(-1)), kind
            assert greedy == sequence[len(prompt) :], (kind, greedy, sequence[len(prompt) :])


# what each family has that the others do not: (q's bias, q's norm, layer 0's post-feed-forward norm)
FAMILY_TENSORS = {
    "qwen2": ("F32", None, None),
    "qwen3": (None, "F32", None),
    "gemma": (None, None, None),
    "gemma2": (None, None, "F32"),
    "gemma3": (None, "F32", "F32"),
    "phi3": (None, None, None),
}


@pytest.mark.parametrize(
    "case",
    ["qwen2-fsdp2-spm", "qwen3-fsdp2-spm", "gemma-fsdp2-spm", "gemma2-fsdp2-spm", "gemma3-fsdp2-spm", "phi3-fsdp2-spm"],
)
def test_qwen_and_gemma_families_as_the_converter_writes_them(case, converter, tmp_path):
    """Qwen2 (tied embeddings, biases on q, k and v), Qwen3 (q and k normed per head, heads of 32 over a
    hidden size of 64), Gemma (norms stored as 1 + weight, CodeGemma's token ids), Gemma 2 (its own
    hyper-parameters: soft caps, sliding window, no rope base), Gemma 3 (q and k norms shifted too, rope per kind
    of layer) and Phi-3 (q, k, v and gate, up fused): llama.cpp's qwen2, qwen3, gemma, gemma2, gemma3 and phi3,
    whose q and k keep transformers' order; the metadata without the llama-only fields. down_proj's rows of 90 do not
    fill q8_0's blocks: f16, as the converter.
    transformers' GGUF reader gives the training model's logits back exactly from f32 (given the config:
    it reads no head width from the file, where llama.cpp reads attention.key_length)."""
    from transformers import AutoModelForCausalLM

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    for kind in ("f32", "q8_0"):
        ours = unshard.convert(
            src, tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), verify=True, progress=False
        )
        assert ours.files == ["model.gguf"]
        assert_same_file(tmp_path / f"{kind}.gguf", converter(tmp_path / "hf", kind, tmp_path / f"oracle-{kind}.gguf"))
    fields, tensors = contents(tmp_path / "q8_0.gguf")
    arch = case.split("-")[0]
    assert fields["general.architecture"] == arch and "llama.vocab_size" not in fields
    types = {name: kind for name, kind, *_ in tensors}
    assert types["blk.0.ffn_down.weight"] == "F16"
    assert types.get("blk.0.attn_q.weight", types.get("blk.0.attn_qkv.weight")) == "Q8_0"  # (Phi-3's q, k, v in one)
    assert (
        types.get("blk.0.attn_q.bias"),
        types.get("blk.0.attn_q_norm.weight"),
        types.get("blk.0.post_ffw_norm.weight"),
    ) == FAMILY_TENSORS[arch]
    if arch == "gemma":
        return  # (transformers' GGUF reader takes no gemma; llama.cpp runs it, test_llama_cpp_runs_the_file_...)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="f32.gguf", dtype=torch.float32, config=reference.config
    )
    ids = torch.tensor([[1, 5, 20, 33, 64, 70, 90, 2]])
    assert torch.equal(model(ids).logits, reference(ids).logits)


@pytest.mark.parametrize("case", ["mixtral8-fsdp2-spm", "qwen2moe-fsdp2", "qwen3moe-fsdp2"])
def test_moe_families_stack_their_experts_as_the_converter_does(case, converter, tmp_path):
    """Mixtral (llama.cpp's llama with 8 experts), Qwen2-MoE (a shared expert behind a gate) and Qwen3-MoE, whose
    FSDP2 checkpoints hold each layer's experts fused in one tensor (transformers 5), written as separate experts in
    the folder: each layer's experts stacked in one tensor per projection, the routers in f32, the experts' counts
    and widths and the size label ("8x...") in the metadata, all as the converter writes them from the folder."""
    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    pre = for_the_converter(tmp_path / "hf")
    for kind in ("f32", "bf16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert_same_file(ours, converter(tmp_path / "hf", kind, tmp_path / f"oracle-{kind}.gguf", pre=pre))
    fields, tensors = contents(tmp_path / "q8_0.gguf")
    arch, experts = fields["general.architecture"], {"mixtral8": 8}.get(case.split("-")[0], 4)
    assert fields[f"{arch}.expert_count"] == experts and fields["general.size_label"].startswith(f"{experts}x")
    shapes = {name: (kind, shape) for name, kind, shape, _ in tensors}
    assert shapes["blk.1.ffn_gate_exps.weight"][1][2] == experts and shapes["blk.1.ffn_gate_inp.weight"] == (
        "F32",
        [64, experts],
    )
    assert not any(".experts." in name or name.count(".") > 3 for name in shapes)


# Rope scalings whose factors the converter computes from the config into tensors of their own: Llama 3's
# (rope_freqs: by 8 beyond an original context of 32, smoothly from 8), and Phi-3's 128k models' (longrope: long and
# short factors per pair of rotary dimensions, an attention factor in the header; an original context of 4096, which
# both llama.cpp's context here and the prompt stay under, so both take the short factors).
COMPUTED_ROPE = {
    "llama-fsdp2-spm": (
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            }
        },
        ["rope_freqs.weight"],
    ),
    "phi3-fsdp2-spm": (
        {
            "max_position_embeddings": 16384,
            "original_max_position_embeddings": 4096,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 1.0,
                "original_max_position_embeddings": 4096,
                "long_factor": [1.0, 1.2, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0],
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.3, 4.0],
            },
        },
        ["rope_factors_long.weight", "rope_factors_short.weight"],
    ),
    # YaRN (as Qwen2.5's and Qwen3's long-context configs set it): header fields only
    "qwen2-fsdp2-spm": (
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
            }
        },
        [],
    ),
}


@pytest.mark.parametrize("case", list(COMPUTED_ROPE))
def test_rope_scalings_as_the_converter_writes_them(case, converter, llama_cpp, ggml_library, monkeypatch, tmp_path):
    """Llama 3's rope frequencies and Phi-3's long and short rope factors: f32 tensors first in the file, as the
    converter computes them (q4_0 and q4_k_m: where llama-quantize puts them, among the tensors outside the blocks by
    name; a K-quant mix of such a model failed before planning put them there); YaRN's fields. llama.cpp then computes
    the model with its scaled rope, ten times closer to transformers' model with it than without."""
    import json

    from transformers import AutoModelForCausalLM

    src, (change, computed) = SHIPPED / case / "global_step_1", COMPUTED_ROPE[case]
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, **change}))
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for kind in ("f32", "q8_0", "q4_0", "q4_k_m"):
        code, _, err = run_cli(
            "convert",
            src,
            tmp_path / f"{kind}.gguf",
            "--config-from",
            tmp_path / "hf",
            "--gguf-type",
            kind,
            "--verify",
            "--no-progress",
        )
        assert code == 0, err
    assert_same_file(tmp_path / "f32.gguf", converter(tmp_path / "hf", "f32", tmp_path / "converter-f32.gguf"))
    assert_same_file(tmp_path / "q8_0.gguf", converter(tmp_path / "hf", "q8_0", tmp_path / "converter-q8_0.gguf"))
    llama_cpp_client("quantize", tmp_path / "converter-f32.gguf", tmp_path / "llama-quantize.gguf", "q4_0", "q8_0")
    assert_same_file(tmp_path / "q4_0.gguf", tmp_path / "llama-quantize.gguf")
    llama_cpp_client("quantize", tmp_path / "converter-f32.gguf", tmp_path / "llama-quantize-k.gguf", "q4_k_m")
    assert_same_file(tmp_path / "q4_k_m.gguf", tmp_path / "llama-quantize-k.gguf")
    assert [t[:2] for t in contents(tmp_path / "f32.gguf")[1][: len(computed)]] == [(n, "F32") for n in computed]

    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0)
    distances = []
    for folder_config in ({**config, **change}, config):  # (with the scaling, then without)
        (tmp_path / "hf" / "config.json").write_text(json.dumps(folder_config))
        with torch.no_grad():
            expected = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)(
                torch.tensor([prompt])
            ).logits[0]
        distances.append(((logits - expected).norm() / expected.norm()).item())
    # (measured: 2.8e-4 against 0.026 for Llama 3's, 2.8e-4 against 4.5e-3 for Phi-3's, whose factors change little
    # over a short prompt)
    assert distances[0] <= LLAMA_CPP_TOLERANCE["f32"] and distances[1] > 10 * distances[0], distances


def test_a_merge_as_one_gguf_file(converter, tmp_path):
    """`unshard merge RECIPE OUT.gguf`: the merged model as the converter writes the merged folder."""
    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "merge_method": "linear",
                "dtype": "float32",
                "models": [
                    {"model": str(src), "parameters": {"weight": 0.7}},
                    {"model": str(src), "parameters": {"weight": 0.3}},
                ],
            }
        )
    )
    unshard.merge(recipe, tmp_path / "merged", progress=False)
    code, _, err = run_cli("merge", recipe, tmp_path / "merged.gguf", "--gguf-type", "q8_0", "--no-progress")
    assert code == 0, err
    assert_same_file(tmp_path / "merged.gguf", converter(tmp_path / "merged", "q8_0", tmp_path / "oracle.gguf"))


def test_the_cli_implies_gguf_from_the_name_and_dry_run_tells_the_size(tmp_path):
    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    code, out, err = run_cli("convert", src, tmp_path / "m.gguf", "--dry-run")
    assert code == 0, err
    assert "gguf         one file for llama.cpp (llama), type bf16: 16 tensor(s) in BF16, 5 tensor(s) in F32" in out
    assert "vocabulary   103 tokens from tokenizer.model (SentencePiece)" in out
    planned = next(line for line in out.splitlines() if "model.gguf" in line)
    assert not (tmp_path / "m.gguf").exists()
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--no-progress")
    assert code == 0, err
    size = (tmp_path / "m.gguf").stat().st_size
    assert unshard.inspect(src, output=unshard.OutputOptions(gguf="auto"))["output"]["files"]["model.gguf"] == size
    assert planned.strip() == f"model.gguf  {human_bytes(size)}"


# tokenizer.json's pre-tokenizers: GPT-2's byte-level split, and Splits by Llama 3's and Qwen2's regexes
# before a byte-level step (as those models' tokenizer.json hold them)
SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
PRE_TOKENIZERS = {
    "gpt-2": None,  # (the fixture's own)
    "llama-bpe": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT % "{1,3}"}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL,
        ],
    },
    "qwen2": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT % ""}, "behavior": "Isolated", "invert": False},
            BYTE_LEVEL,
        ],
    },
}


@pytest.mark.parametrize(
    "case, pre", [("llama-fsdp2", "gpt-2"), ("llama-fsdp2", "llama-bpe"), ("qwen2-fsdp2", "qwen2")]
)
def test_byte_level_bpe_vocabularies_as_the_converter_writes_them(case, pre, converter, tmp_path):
    """A byte-level BPE tokenizer.json (trained by the fixtures; special tokens, added ones, merges): llama.cpp's
    gpt2 tokenizer model, the pre-tokenizer named by its split. The converter knows a pre-tokenizer only by the
    hash of a known model's tokens, so it is told the name here (llama_cpp_converter.py); all else is its own."""
    import json

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    described = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())
    if PRE_TOKENIZERS[pre] is not None:
        described["pre_tokenizer"] = PRE_TOKENIZERS[pre]
        described["model"]["ignore_merges"] = pre == "llama-bpe"  # (as Llama 3's: llama.cpp's llama-bpe does so)
        (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(described))
    # The converter's venv has transformers 4, which does not know the class name transformers 5 saves.
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    code, _, err = run_cli(
        "convert",
        src,
        tmp_path / "m.gguf",
        "--config-from",
        tmp_path / "hf",
        "--no-progress",
        "--gguf-type",
        "f16",
        "--verify",
    )
    assert code == 0, err
    assert_same_file(tmp_path / "m.gguf", converter(tmp_path / "hf", "f16", tmp_path / "oracle.gguf", pre=pre))
    fields = contents(tmp_path / "m.gguf")[0]
    assert (fields["tokenizer.ggml.model"], fields["tokenizer.ggml.pre"]) == ("gpt2", pre)
    assert len(fields["tokenizer.ggml.tokens"]) == 103 and fields["tokenizer.ggml.merges"]


def test_the_converter_s_own_table_names_a_tokenizer_it_lists(monkeypatch, tmp_path):
    """With UNSHARD_LLAMA_CPP naming a llama.cpp checkout, the pre-tokenizer is named as its converter's table names
    it: here a copy of the converter whose table lists the fixture's tokenizer by the hash the converter itself
    computes for it (as llama.cpp's convert_hf_to_gguf_update.py adds a model), under a name other than its split's
    (DeepSeek-R1's Qwen distills' over Qwen2's split). The file equals that converter's; against the table as
    released, which lists no such tokenizer, the split names it; a checkout without the converter is one line."""
    src = SHIPPED / "qwen2-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    described = json.loads((tmp_path / "hf" / "tokenizer.json").read_text())
    described["pre_tokenizer"] = PRE_TOKENIZERS["qwen2"]
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(described))
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    (tmp_path / "hf" / "tokenizer_config.json").write_text(
        json.dumps({**config, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    root = generate.llama_cpp_source()

    def convert(checkout: Path, *args: str) -> subprocess.CompletedProcess:
        """The converter of this checkout, run on the folder."""
        return subprocess.run(
            [str(generate.peer_python("llamacpp")), str(checkout / "convert_hf_to_gguf.py"), str(tmp_path / "hf")]
            + list(args),
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
        )

    refused = convert(root, "--outfile", str(tmp_path / "refused.gguf"))
    assert refused.returncode != 0 and "** chkhsh:" in refused.stderr, refused.stderr[-2000:]
    chkhsh = refused.stderr.split("** chkhsh:")[1].split()[0]
    checkout = tmp_path / "llama.cpp"
    (checkout / "conversion").mkdir(parents=True)
    (checkout / "gguf-py").symlink_to(root / "gguf-py")
    # (copied: Python puts a script's own folder first on its path, a symlink's target's)
    shutil.copyfile(root / "convert_hf_to_gguf.py", checkout / "convert_hf_to_gguf.py")
    for path in (root / "conversion").iterdir():
        if path.name != "base.py":
            (checkout / "conversion" / path.name).symlink_to(path)
    base = (root / "conversion" / "base.py").read_text()
    listed = f'        res = None\n        if chkhsh == "{chkhsh}":\n            res = "deepseek-r1-qwen"\n'
    assert base.count("        res = None\n") == 1
    (checkout / "conversion" / "base.py").write_text(base.replace("        res = None\n", listed))
    oracle = tmp_path / "oracle.gguf"
    done = convert(checkout, "--outtype", "f16", "--outfile", str(oracle))
    assert done.returncode == 0, done.stderr[-3000:]

    def ours(name: str, checkout: Path) -> Path:
        monkeypatch.setenv("UNSHARD_LLAMA_CPP", str(checkout))
        output = OutputOptions(gguf="f16")
        unshard.convert(src, tmp_path / name, config_from=tmp_path / "hf", output=output, progress=False)
        return tmp_path / name

    assert_same_file(ours("listed.gguf", checkout), oracle)
    assert contents(oracle)[0]["tokenizer.ggml.pre"] == "deepseek-r1-qwen"
    assert contents(ours("released.gguf", root))[0]["tokenizer.ggml.pre"] == "qwen2"
    with pytest.raises(UnshardError, match=r"^UNSHARD_LLAMA_CPP=\S+: no llama.cpp converter there"):
        ours("none.gguf", tmp_path / "hf")
    assert not (tmp_path / "none.gguf").exists()


def gemma3_with_a_byte_level_bpe(tmp_path: Path, more_tokens: int) -> tuple[Path, Path]:
    """The Gemma 3 fixture (an embedding of 103 rows) with the Llama fixture's trained byte-level BPE in place of its
    SentencePiece model (63 tokens, 4 of them also listed as added ones), `more_tokens` tokens added to its
    vocabulary (never made by a merge); the checkpoint, and the folder to take the config and tokenizer from."""
    import json

    src = SHIPPED / "gemma3-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    (tmp_path / "hf" / "tokenizer.model").unlink()
    bpe = SHIPPED / "llama-fsdp2" / "global_step_1" / "actor" / "huggingface"
    described = json.loads((bpe / "tokenizer.json").read_text())
    vocab = described["model"]["vocab"]
    vocab.update({f"extra{i}": len(vocab) + i for i in range(more_tokens)})
    (tmp_path / "hf" / "tokenizer.json").write_text(json.dumps(described))
    shutil.copyfile(bpe / "tokenizer_config.json", tmp_path / "hf" / "tokenizer_config.json")
    assert for_the_converter(tmp_path / "hf") == "gpt-2"
    return src, tmp_path / "hf"


def with_hub_vision_names(folder: Path, out: Path) -> Path:
    """A copy of a Gemma 3 folder with its vision tower's tensors under the names the Hub's Gemma 3 checkpoints have
    (vision_tower.vision_model...): transformers 5 saves them as vision_tower..., which llama.cpp's converter cannot
    map (nor transformers 4 load: it leaves the tower at random)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, out)
    tensors = load_file(out / "model.safetensors")
    save_file(
        {name.replace("vision_tower.", "vision_tower.vision_model.", 1): t for name, t in tensors.items()},
        out / "model.safetensors",
        metadata={"format": "pt"},
    )
    return out


def test_gemma3_vision_model_writes_its_mmproj_beside_as_the_converter_does(converter, llama_cpp, tmp_path):
    """A Gemma 3 with its vision tower (FSDP2 rank files): OUT is the text model, equal to the converter's file for
    the folder, and mmproj-OUT beside it the vision tower and projector, equal to the converter's --mmproj file: the
    `clip` architecture, the vision sizes, the image processor's mean and std, the projector's scale (2 x 2 patches
    to a token here, not Gemma 3's 4 x 4), its norm shifted by one, its projection in F16 and the embeddings in F32
    whatever the type; rows of 48 fall back to F16 in q8_0. For llama-quantize's types the text model is theirs and
    the mmproj stays in f16. llama.cpp runs the text model as transformers does."""
    from transformers import AutoModelForCausalLM

    src = SHIPPED / "gemma3vl-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    hub = with_hub_vision_names(tmp_path / "hf", tmp_path / "hub")
    for kind in ("f32", "f16", "q8_0"):
        ours = tmp_path / f"{kind}.gguf"
        result = unshard.convert(src, ours, output=unshard.OutputOptions(gguf=kind), verify=True, progress=False)
        assert result.files == ["model.gguf", "mmproj.gguf"] and not leftovers(tmp_path)
        assert_same_file(ours, converter(hub, kind, tmp_path / f"oracle-{kind}.gguf"))
        assert_same_file(
            tmp_path / f"mmproj-{kind}.gguf", converter(hub, kind, tmp_path / f"oracle-mmproj-{kind}.gguf", mmproj=True)
        )
    fields, tensors = contents(tmp_path / "mmproj-q8_0.gguf")
    assert fields["general.architecture"] == "clip" and fields["clip.projector_type"] == "gemma3"
    assert fields["clip.vision.projector.scale_factor"] == 2 and fields["clip.vision.image_mean"] == [0.5] * 3
    types = {name: kind for name, kind, *_ in tensors}
    assert (
        types["mm.input_projection.weight"],
        types["v.patch_embd.weight"],
        types["v.blk.0.attn_q.weight"],
        types["v.blk.0.ffn_down.weight"],
    ) == ("F16", "F32", "Q8_0", "F16")
    assert "vision_tower" not in str(contents(tmp_path / "f32.gguf")[1])  # (the text file holds no vision tensor)
    code, out, _ = run_cli("convert", src, tmp_path / "dry.gguf", "--gguf-type", "q8_0", "--dry-run")
    assert code == 0 and "mmproj       the vision tower, for llama.cpp" in out
    assert "mmproj.gguf" in out and "type q8_0" in out
    (tmp_path / "mmproj-again.gguf").write_bytes(b"someone's")  # (an mmproj in the way is kept, as OUT would be)
    code, _, err = run_cli("convert", src, tmp_path / "again.gguf", "--no-progress")
    assert code == 1 and "mmproj-again.gguf: already exists" in err and not (tmp_path / "again.gguf").exists()
    assert (tmp_path / "mmproj-again.gguf").read_bytes() == b"someone's" and not leftovers(tmp_path)
    f32 = tmp_path / "oracle-f32.gguf"
    unshard.convert(src, tmp_path / "q4_0.gguf", output=unshard.OutputOptions(gguf="q4_0"), progress=False)
    llama_cpp_client("quantize", f32, tmp_path / "llama-quantize-q4_0.gguf", "q4_0", "q8_0")
    assert_same_file(tmp_path / "q4_0.gguf", tmp_path / "llama-quantize-q4_0.gguf")
    assert_same_file(tmp_path / "mmproj-q4_0.gguf", tmp_path / "mmproj-f16.gguf")
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)(
            torch.tensor([prompt])
        ).logits[0]
    logits, _ = llama_cpp(tmp_path / "f32.gguf", prompt, 0)
    assert ((logits - expected).norm() / expected.norm()).item() <= LLAMA_CPP_TOLERANCE["f32"]


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"vision_config": {"vision_use_head": True}},
            "a pooling head (vision_use_head), which llama.cpp's gemma3 projector",
        ),
        # (before transformers' config class, asked for the model's names after, refuses it too)
        ({"vision_config": {"patch_size": None}}, "config.json: vision_config lacks patch_size, which the mmproj file"),
        ({}, "no image processor's image_mean and image_std"),
    ],
)
def test_a_vision_part_llama_cpp_cannot_take_is_one_line(change, expected, tmp_path):
    """The mmproj file's facts missing or unlike what llama.cpp's gemma3 projector runs: one line before anything is
    written, neither file left (the processor's settings are gone with processor_config.json)."""
    import json

    src = SHIPPED / "gemma3vl-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    for key, value in change.get("vision_config", {}).items():
        config["vision_config"][key] = value
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    if not change:
        (tmp_path / "hf" / "processor_config.json").unlink()
    # (--no-check: transformers' model of such a config has other tensors, which the config check says first)
    code, _, err = run_cli(
        "convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress", "--no-check"
    )
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "mmproj-m.gguf").exists() and not leftovers(tmp_path)


def test_llama_cpp_sees_an_image_through_the_mmproj_as_transformers_does(tmp_path):
    """llama.cpp's multimodal library (mtmd, as llama-mtmd-cli and llama-server run it) loads the text model with its
    mmproj file and encodes an image of 56 x 56 pixels into 4 image tokens: their embeddings are transformers'
    image features of the unsharded model (get_image_features), measured relative distance 5e-4 (f32, f16) and 9e-3
    (q8_0). The folder's tokenizer_config.json lists the image tokens as the Hub's Gemma 3 does (transformers 5 keeps
    them in tokenizer.json only, where the converter does not look): mtmd wraps the image in them."""
    import json

    import numpy as np
    from transformers import AutoModelForImageTextToText

    src = SHIPPED / "gemma3vl-fsdp2-spm" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {
        str(i): {
            "content": text,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for i, text in ((96, "<start_of_image>"), (97, "<end_of_image>"), (98, "<image_soft_token>"))
    }
    (tmp_path / "hf" / "tokenizer_config.json").write_text(json.dumps(config))
    image = np.random.default_rng(0).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    image.tofile(tmp_path / "image.rgb")
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    pixels = (torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255 - 0.5) / 0.5  # (the image processor's)
    with torch.no_grad():
        expected = model.model.get_image_features(pixel_values=pixels).pooler_output[0]
    assert expected.shape == (4, 64)
    for kind, tolerance in (("f32", 1e-3), ("f16", 2e-3), ("q8_0", 0.03)):
        gguf_file = tmp_path / f"{kind}.gguf"
        unshard.convert(
            src, gguf_file, config_from=tmp_path / "hf", output=unshard.OutputOptions(gguf=kind), progress=False
        )
        llama_cpp_client(
            "image",
            gguf_file,
            tmp_path / f"mmproj-{kind}.gguf",
            56,
            56,
            tmp_path / "image.rgb",
            tmp_path / f"{kind}.npy",
        )
        embeddings = torch.from_numpy(np.load(tmp_path / f"{kind}.npy"))
        distance = ((embeddings - expected).norm() / expected.norm()).item()
        assert embeddings.shape == (4, 64) and distance <= tolerance, (kind, distance)


def test_gemma3_with_a_byte_level_bpe_vocabulary(converter, tmp_path):
    """Gemma 3 with a tokenizer.json alone. The converter cuts the embedding to the tokens it counts there (vocabulary
    and added tokens); with 40 more, 107 counted for 103 rows, nothing is cut, and the file is the converter's. With
    fewer than the rows, the converter's cut file is one llama.cpp refuses (it lists the config's 103 tokens): that
    is one line here, before anything is written."""
    src, hf = gemma3_with_a_byte_level_bpe(tmp_path / "whole", 40)
    code, _, err = run_cli(
        "convert", src, tmp_path / "m.gguf", "--config-from", hf, "--no-progress", "--gguf-type", "f32"
    )
    assert code == 0, err
    assert_same_file(tmp_path / "m.gguf", converter(hf, "f32", tmp_path / "oracle.gguf", pre="gpt-2"))
    assert contents(tmp_path / "m.gguf")[0]["tokenizer.ggml.model"] == "gpt2"

    src, hf = gemma3_with_a_byte_level_bpe(tmp_path / "short", 0)
    code, _, err = run_cli("convert", src, tmp_path / "short.gguf", "--config-from", hf, "--no-progress")
    assert code == 1 and len(err.strip().splitlines()) == 1 and not (tmp_path / "short.gguf").exists()
    assert "67 tokens for an embedding of 103 rows; llama.cpp's converter would cut" in err
    cut = converter(hf, "f32", tmp_path / "cut.gguf", pre="gpt-2")
    refused = subprocess.run(
        [
            str(generate.peer_python("llamacpp-client")),
            str(Path(__file__).parent / "llama_cpp_client.py"),
            "run",
            str(cut),
            "1,5",
            str(tmp_path / "cut.npz"),
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "Failed to load model" in refused.stderr  # (token_embd has the wrong shape)


def test_k_quants_of_experts_and_grouped_queries(converter, llama_cpp, ggml_library, monkeypatch, tmp_path):
    """A Qwen3-MoE of rows of 256 as transformers writes it (4 experts, 4 query heads to a key's): every K-quant
    mix equals llama-quantize's, the experts' stacks in K-quants (ffn_down's by the block its name gives); llama.cpp
    runs the q4_k_m file, its logits' relative distance from transformers' within 4 bits' (0.35)."""
    import json

    from transformers import AutoConfig, AutoModelForCausalLM

    model_folder = SHIPPED / "qwen3moe-fsdp2" / "global_step_1" / "actor" / "huggingface"
    config = json.loads((model_folder / "config.json").read_text())
    widths = dict(hidden_size=256, intermediate_size=256, moe_intermediate_size=256, head_dim=64)
    config.update(widths, num_attention_heads=8, num_key_value_heads=2, num_experts=4, num_hidden_layers=3)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16)
    model.save_pretrained(tmp_path / "hf")
    for tokenizer_file in model_folder.glob("tokenizer*"):
        shutil.copy(tokenizer_file, tmp_path / "hf")
    f32 = converter(tmp_path / "hf", "f32", tmp_path / "converter-f32.gguf", pre=for_the_converter(tmp_path / "hf"))
    (tmp_path / "llama-quantize").mkdir()
    llama_cpp_client("quantize", f32, tmp_path / "llama-quantize", ",".join(kquants.MIXES))
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, ggml_library)
    for kind in kquants.MIXES:
        unshard.convert(
            tmp_path / "hf", tmp_path / f"{kind}.gguf", output=unshard.OutputOptions(gguf=kind), progress=False
        )
        assert_same_file(tmp_path / f"{kind}.gguf", tmp_path / "llama-quantize" / f"{kind}.gguf")
    types = {t[0]: t[1] for t in contents(tmp_path / "q4_k_m.gguf")[1]}
    assert [types[f"blk.{i}.ffn_down_exps.weight"] for i in range(3)] == ["Q4_K", "Q4_K", "Q6_K"]
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    assert {t[0]: t[1] for t in contents(tmp_path / "q2_k.gguf")[1]}["blk.0.attn_v.weight"] == "Q4_K"  # (4 queries)
    prompt = [1, 5, 20, 33, 64, 70, 90, 2]
    expected = model.float()(torch.tensor([prompt])).logits[0]
    logits, _ = llama_cpp(tmp_path / "q4_k_m.gguf", prompt, 0)
    distance = ((logits - expected).norm() / expected.norm()).item()
    assert 0 < distance <= 0.35, distance


@pytest.mark.parametrize(
    "case, args, expected",
    [
        ("mllama-fsdp2", (), "MllamaForConditionalGeneration is not an architecture unshard writes as GGUF yet"),
        (
            "llama-fsdp2-spm",
            ("--gguf-type", "q2_k_s"),
            "--gguf-type q2_k_s: a llama-quantize type that needs an importance matrix (or that unshard does not "
            "write yet); write f16 (or f32) here and run `llama-quantize",
        ),
        ("llama-fsdp2-spm", ("--gguf-type", "q7"), "--gguf-type q7: not one unshard writes; choose one of f32, f16"),
        ("llama-fsdp2-spm", ("--quantize", "W4A16"), "a GGUF file takes no --quantize"),
    ],
)
def test_what_gguf_cannot_take_is_one_line_before_anything_is_written(case, args, expected, tmp_path):
    code, _, err = run_cli("convert", SHIPPED / case / "global_step_1", tmp_path / "m.gguf", *args, "--no-progress")
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


def test_k_quants_without_llama_cpp_s_library_are_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv(kquants.LIBRARY_VARIABLE, str(tmp_path / "libggml-base.so"))
    code, _, err = run_cli(
        "convert", SHIPPED / "llama-fsdp2-spm" / "global_step_1", tmp_path / "m.gguf", "--gguf-type", "q4_k_m"
    )
    expected = f"--gguf-type q4_k_m: {kquants.LIBRARY_VARIABLE}={tmp_path / 'libggml-base.so'} is not a file"
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


def test_k_quants_find_llama_cpp_python_s_library(ggml_library, monkeypatch):
    """Without UNSHARD_GGML_LIBRARY, the library is the one of the llama-cpp-python Python finds (here the peer venv's
    on the path, last), found without importing it."""
    import sys

    monkeypatch.delenv(kquants.LIBRARY_VARIABLE, raising=False)
    monkeypatch.setattr(sys, "path", [*sys.path, str(Path(ggml_library).parents[2])])
    assert kquants.library_path("q4_k_m") == Path(ggml_library)
    assert "llama_cpp" not in sys.modules


def test_a_config_naming_no_architecture_takes_it_from_the_command_line(tmp_path):
    import json

    ckpt = tmp_path / "global_step_1"
    shutil.copytree(SHIPPED / "llama-fsdp2-spm" / "global_step_1", ckpt)
    config = ckpt / "actor" / "huggingface" / "config.json"
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "architectures"}))
    code, _, err = run_cli("convert", ckpt, tmp_path / "m.gguf", "--no-progress")
    assert code == 1 and "names no architecture (no `architectures`)" in err and "pass --architecture" in err, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)
    code, _, err = run_cli("convert", ckpt, tmp_path / "m.gguf", "--no-progress", "--architecture", "LlamaForCausalLM")
    assert code == 0, err
    code, _, err = run_cli(
        "convert", SHIPPED / "llama-fsdp2-spm" / "global_step_1", tmp_path / "intact.gguf", "--no-progress"
    )
    assert code == 0 and (tmp_path / "m.gguf").read_bytes() == (tmp_path / "intact.gguf").read_bytes()


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("truncated", "not a SentencePiece model"),
        ("a piece not UTF-8", "token 0's piece is not UTF-8 text; restore the file"),  # (the file still parses)
    ],
)
def test_a_damaged_tokenizer_model_is_one_line(damage, expected, tmp_path):
    ckpt = tmp_path / "global_step_1"
    shutil.copytree(SHIPPED / "gemma-fsdp2-spm" / "global_step_1", ckpt)
    model = ckpt / "actor" / "huggingface" / "tokenizer.model"
    data = model.read_bytes()
    if damage == "truncated":
        data = data[: len(data) // 2]
    else:
        at = data.index(b"<unk>")  # token 0's piece, written once
        data = data[:at] + b"\xc0" + data[at + 1 :]
    model.write_bytes(data)
    code, _, err = run_cli("convert", ckpt, tmp_path / "m.gguf", "--no-progress")
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize("check", [(), ("--no-check",)])
def test_a_chat_template_not_utf8_is_one_line(check, tmp_path):
    """Caught by the plan's check of the model files, and, past --no-check, where gguf-py reads it."""
    ckpt = tmp_path / "global_step_1"
    shutil.copytree(SHIPPED / "qwen3-fsdp2-spm" / "global_step_1", ckpt)
    (ckpt / "actor" / "huggingface" / "chat_template.jinja").write_bytes(b"\xc1\xff{{ messages }}")
    code, _, err = run_cli("convert", ckpt, tmp_path / "m.gguf", "--no-progress", *check)
    assert code == 1 and "chat_template.jinja: not UTF-8 text" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"pre_tokenizer": {"type": "Whitespace"}}, "its pre-tokenizer is not one unshard can name for llama.cpp"),
        (
            {
                "model": {
                    "type": "WordPiece",
                    "unk_token": "<unk>",
                    "continuing_subword_prefix": "##",
                    "max_input_chars_per_word": 100,
                    "vocab": {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3},
                }
            },
            "a WordPiece tokenizer, not a byte-level BPE",
        ),
        (
            {"model": {"type": "BPE", "vocab": {}, "merges": [], "byte_fallback": True}},
            "a BPE with byte fallback tokenizer, not a byte-level BPE",
        ),
        ({"model": {"type": "BPE", "vocab": {}, "merges": []}}, "a BPE tokenizer without a vocabulary"),
    ],
)
def test_a_tokenizer_llama_cpp_cannot_take_is_one_line(change, expected, tmp_path):
    import json

    src = SHIPPED / "llama-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    path = tmp_path / "hf" / "tokenizer.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    code, _, err = run_cli("convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress")
    assert code == 1 and expected in err and str(path) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


@pytest.mark.parametrize(
    "case, change, expected",
    [
        (
            "gemma2-fsdp2-spm",
            {"final_logit_softcapping": None},
            "no final_logit_softcapping, which llama.cpp's gemma2 needs",
        ),
        # llama.cpp scales queries by 1/sqrt(head_dim) (16 here), whatever the config says
        (
            "gemma2-fsdp2-spm",
            {"query_pre_attn_scalar": 256},
            "query_pre_attn_scalar is 256, but llama.cpp's gemma2 scales queries by 1/sqrt(16)",
        ),
        (
            "gemma3-fsdp2-spm",
            {"query_pre_attn_scalar": 64},
            "query_pre_attn_scalar is 64, but llama.cpp's gemma3 scales",
        ),
        # llama.cpp's gemma3 makes every sixth layer global
        (
            "gemma3-fsdp2-spm",
            {"layer_types": ["full_attention"] + ["sliding_attention"] * 5},
            "layer_types is not one global layer in six",
        ),
        # llama.cpp renormalises the chosen experts' weights for qwen3moe, never for qwen2moe; runs no dense layer there
        (
            "qwen3moe-fsdp2",
            {"norm_topk_prob": False},
            "norm_topk_prob is False, but llama.cpp's qwen3moe always renormalises",
        ),
        (
            "qwen2moe-fsdp2",
            {"norm_topk_prob": True},
            "norm_topk_prob is True, but llama.cpp's qwen2moe never renormalises",
        ),
        ("qwen2moe-fsdp2", {"mlp_only_layers": [1]}, "some layers are dense (mlp_only_layers, decoder_sparse_step)"),
        # rope scalings: one unshard does not write yet; Phi-3's factors, one per pair of rotary dimensions
        (
            "llama-fsdp2-spm",
            {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}},
            "rope type 'dynamic' is not written as GGUF by unshard yet",
        ),
        (
            "phi3-fsdp2-spm",
            {
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "long_factor": [1.0] * 4,
                    "short_factor": [1.0] * 4,
                    "original_max_position_embeddings": 64,
                }
            },
            "4 long and 4 short rope factors for 16 rotary dimensions (one per pair, 8)",
        ),
        # what llama.cpp's smollm3 and gpt-oss assume: NoPE every fourth layer, no sliding window; SwiGLU's clamp
        ("smollm3-fsdp2", {"no_rope_layers": [1, 0, 1, 1]}, "no_rope_layers is not every fourth layer"),
        ("smollm3-fsdp2", {"use_sliding_window": True}, "use_sliding_window is set, and llama.cpp's smollm3 has no"),
        ("gptoss-fsdp2", {"swiglu_limit": 10.0}, "swiglu_limit is 10.0, and llama.cpp's gpt-oss computes with 7.0"),
        # Granite's heads as hidden_size / heads wide; EXAONE 4's sliding windows on 64 layers alone; StableLM's rope
        # base of 10000
        ("granite-fsdp2", {"head_dim": 32}, "head_dim is 32, and llama.cpp's granite takes heads of hidden_size"),
        (
            "exaone4-fsdp2",
            {"sliding_window": 32, "layer_types": ["sliding_attention", "full_attention"]},
            "a sliding window on 2 layers, which llama.cpp's exaone4 runs as global layers with rope",
        ),
        ("stablelm-fsdp2", {"rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.25}}, "rope_theta is"),
        (
            "cohere-fsdp2",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
            "rope type 'linear', and llama.cpp's command-r turns rope unscaled",
        ),
        (
            "gptneox-fsdp2",
            {"rope_parameters": {"rope_theta": 1e6, "partial_rotary_factor": 0.25, "rope_type": "default"}},
            "rope_theta is 1000000.0, and llama.cpp's gptneox turns rope at 10000",
        ),
        ("falcon-fsdp2", {"alibi": True}, "alibi is set (Falcon-RW's), which llama.cpp's falcon does not compute"),
        ("falcon-fsdp2", {"ffn_hidden_size": 128}, "ffn_hidden_size is 128, and llama.cpp's falcon takes 4 x 64"),
        ("phi2-fsdp2", {"qk_layernorm": True}, "qk_layernorm is set, and llama.cpp's phi2 has no q and k norms"),
        ("gpt2-fsdp2", {"n_inner": 128}, "n_inner is 128, and llama.cpp's gpt2 takes 4 x 64"),
        ("bloom-fsdp2", {"apply_residual_connection_post_layernorm": True}, "which llama.cpp's bloom does not compute"),
        ("starcoder-fsdp2", {"multi_query": False}, "multi_query is false, and llama.cpp's starcoder takes one"),
        ("olmoe-fsdp2", {"norm_topk_prob": True}, "norm_topk_prob is set, and llama.cpp's olmoe never renormalises"),
        ("olmoe-fsdp2", {"num_key_value_heads": 2}, "num_key_value_heads is 2, and llama.cpp's olmoe gives each"),
        ("ernie45moe-fsdp2-spm", {"moe_layer_end_index": 0}, "moe_layer_end_index is 0, and llama.cpp's ernie4_5-moe"),
        ("dots1-fsdp2", {"scoring_func": None}, "the experts' gating function is None, not 'sigmoid' (scoring_func)"),
        ("dots1-fsdp2", {"num_key_value_heads": 2}, "num_key_value_heads is 2, and llama.cpp's dots1 gives each"),
        # GLM-4.7-Flash's dense layers, which llama.cpp's deepseek2 runs first only; a gating function transformers
        # does not route by
        ("glm47flash-fsdp2", {"mlp_layer_types": ["sparse", "dense"]}, "has a dense layer after a sparse one"),
        ("minimax-m2-fsdp2", {"scoring_func": "softmax"}, "function is 'softmax', and transformers' minimax_m2 routes"),
        # Command R7B's layers, which llama.cpp's cohere2 takes as three in four sliding, its output tied
        ("cohere2-fsdp2", {"layer_types": ["full_attention"] * 4}, "layer_types is not a sliding window on three"),
        ("cohere2-fsdp2", {"tie_word_embeddings": False}, "tie_word_embeddings is false, and llama.cpp's cohere2 has"),
        # Hunyuan's NTK alpha rope, which the converter takes for a 256k context from 10000 and 32k or 256k only
        ("hunyuan-fsdp2", {"max_position_embeddings": 4096}, "max_position_embeddings 4096; llama.cpp's converter"),
        # what llama.cpp's afmoe computes whatever the config says: muP's scaled embeddings, renormalised routing
        ("afmoe-fsdp2", {"mup_enabled": False}, "mup_enabled is false, and llama.cpp's afmoe scales the embeddings"),
        ("afmoe-fsdp2", {"route_norm": False}, "route_norm is false, and transformers' AFMoE renormalises"),
        ("jais2-fsdp2", {"mlp_bias": False}, "mlp_bias is false, and llama.cpp's jais2 takes biases there"),
        ("lfm2-fsdp2", {"conv_bias": True}, "conv_bias is set, and llama.cpp's lfm2 convolution has no biases"),
        ("mamba2-fsdp2", {"use_bias": True}, "use_bias is set, and llama.cpp's mamba2 has no biases"),
        ("mamba-fsdp2", {"use_conv_bias": False}, "use_conv_bias is off, and llama.cpp's mamba reads the bias"),
        ("falconmamba-fsdp2", {"use_bias": True}, "use_bias is set, and llama.cpp's mamba has no biases"),
        ("jamba-fsdp2-spm", {"mamba_proj_bias": True}, "mamba_proj_bias is set, and llama.cpp's jamba has no such"),
        ("glm5-fsdp2", {"scoring_func": "softmax"}, "gating function is 'softmax', and transformers' GLM-5 routes by"),
        (
            "dbrx-fsdp2",
            {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},
            "attn_config's rope_theta is 500000.0, which llama.cpp's converter writes, and transformers turns rope at "
            "10000.0",
        ),
        ("jamba-fsdp2-spm", {"sliding_window": 64}, "sliding_window is 64, which llama.cpp's jamba has not"),
        (
            "mamba2-fsdp2",
            {"vocab_size": 120},
            "vocab_size is 120, which llama.cpp's converter pads to a multiple of 16",
        ),
        # Granite 4.0's hybrids: rope, a clamped time step, all attention layers, a vocabulary the converter pads,
        # experts chosen where there are none
        ("granitehybrid-fsdp2", {"position_embedding_type": "rope"}, "position_embedding_type is rope, and llama.cpp"),
        ("granitehybrid-fsdp2", {"time_step_limit": [0.0, 10.0]}, "llama.cpp's granitehybrid clamps no time step"),
        ("granitehybrid-fsdp2", {"layer_types": ["attention"] * 4}, "in a model of attention layers alone, which"),
        ("granitehybrid-fsdp2", {"vocab_size": 100}, "vocab_size is 100, which llama.cpp's converter pads"),
        ("granitehybrid-fsdp2", {"num_local_experts": 0}, "num_experts_per_tok is 2 with no experts"),
        # Nemotron-H: a sliding window, another activation, a vocabulary the converter pads; MLP layers beside experts,
        # experts chosen within groups
        (
            "nemotronhmoe-fsdp2",
            {"layers_block_type": ["mamba", "moe", "attention", "mlp"]},
            "a MoE model with MLP layers",
        ),
        ("nemotronhmoe-fsdp2", {"n_group": 2, "topk_group": 1}, "experts chosen within 1 of 2 groups"),
        ("nemotronh-fsdp2", {"sliding_window": 2}, "sliding_window is 2, which llama.cpp's nemotron_h does not"),
        ("nemotronh-fsdp2", {"mlp_hidden_act": "silu"}, "mlp_hidden_act is 'silu', which llama.cpp's nemotron_h"),
        ("nemotronh-fsdp2", {"vocab_size": 100}, "vocab_size is 100, which llama.cpp's converter pads"),
        # EXAONE MoE: the experts chosen within groups, another gating than transformers', dense layers not first
        ("exaonemoe-fsdp2", {"n_group": 2, "topk_group": 1}, "the experts are chosen within 1 of 2 groups"),
        ("exaonemoe-fsdp2", {"scoring_func": "softmax"}, "the experts' gating function is 'softmax', and transformers"),
        ("exaonemoe-fsdp2", {"mlp_layer_types": ["dense", "sparse", "dense", "sparse"]}, "a dense layer after"),
        ("sarvammoe-fsdp2", {"n_group": 2, "topk_group": 1}, "the experts are chosen within 1 of 2 groups"),
        ("sarvammoe-fsdp2", {"num_nextn_predict_layers": 1}, "num_nextn_predict_layers is 1, MTP layers"),
        ("sarvammoe-fsdp2", {"head_dim": 32}, "the queries are 128 wide where the model is 64"),
        ("sarvammoe-fsdp2", {"score_function": "softmax"}, "the experts' gating function is 'softmax'"),
        ("exaone-fsdp2", {"hidden_act": "gelu"}, "the MLP's activation is 'gelu', and llama.cpp's exaone runs SiLU"),
        (
            "exaonemoe-fsdp2",
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
            "rope type 'linear', and llama.cpp's converter writes EXAONE MoE without rope scaling",
        ),
        # Gemma 4: other rope than its proportional one on the global layers, keys and values reused of other layers
        # than llama.cpp reuses, per-layer embeddings for another vocabulary, a layer sized apart from its kind (which
        # transformers refuses), and what Gemma 3 refuses as well
        (
            "gemma4-fsdp2",
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            },
            "rope_parameters are not Gemma 4's (proportional rope on the global layers",
        ),
        ("gemma4-fsdp2", {"num_kv_shared_layers": 2}, "the last 2 layers reuse keys and values of layers other than"),
        ("gemma4-fsdp2", {"vocab_size_per_layer_input": 50}, "per-layer embeddings for another vocabulary"),
        (
            "gemma4-fsdp2",
            {"per_layer_config": {"2": {"head_dim": 32}, "5": {"head_dim": 64}}},
            "transformers cannot build the model from it (Layer type 'full_attention' is not homogeneous",
        ),
        ("gemma4-fsdp2", {"hidden_activation": "silu"}, "hidden_activation is silu, and llama.cpp's gemma4 runs GELU"),
        ("gemma4moe-fsdp2", {"attn_logit_softcapping": 50.0}, "which llama.cpp's gemma3 and gemma4 do not apply"),
        # MPT: what transformers' class computes with whatever the config says (ALiBi's largest bias of 8, a head's
        # own keys and values) and llama.cpp's mpt otherwise (its LayerNorms' epsilon, the attention's scale)
        ("mpt-fsdp2", {"attn_config": {"alibi_bias_max": 4}}, "alibi_bias_max 4, and transformers' MPT turns ALiBi"),
        ("mpt-fsdp2", {"attn_config": {"kv_n_heads": 2}}, "kv_n_heads is 2, and transformers' MPT gives every head"),
        ("mpt-fsdp2", {"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon is 1e-06, and llama.cpp's converter writes"),
        ("mpt-fsdp2", {"attn_config": {"softmax_scale": 0.5}}, "softmax_scale is 0.5, and llama.cpp's mpt scales"),
        ("apertus-fsdp2", {"hidden_act": "silu"}, "hidden_act is silu, and llama.cpp's apertus runs xIELU"),
        # DeepSeek-V2's groups, which llama.cpp ranks by V3's rule
        (
            "deepseekv2-fsdp2",
            {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
            "ranks groups by their best expert, and llama.cpp's deepseek2 by the sum of their best two",
        ),
        # a config of other experts (or key-value heads, StableLM's norm per head) than the checkpoint's
        (
            "stablelm-fsdp2",
            {"num_key_value_heads": 2},
            "blk.0.attn_k_norm.weight stacks 2 heads' norms of one shape in llama.cpp, and the checkpoint has heads' "
            "norms [0, 1, 2, 3]",
        ),
        (
            "mixtral8-fsdp2-spm",
            {"num_local_experts": 4},
            "_exps.weight stacks 4 experts of one shape in llama.cpp, and "
            "the checkpoint has experts [0, 1, 2, 3, 4, 5, 6, 7]",
        ),
    ],
)
def test_a_config_llama_cpp_would_run_otherwise_is_one_line(case, change, expected, tmp_path):
    """Refused while planning, in one line naming the file, nothing written. Asked of the library (the CLI prints
    such an error as its one line: test_the_cli_says_a_refused_config_in_one_line), so that transformers, imported
    once, reads each changed config."""
    assert_refused_in_one_line(case, lambda config: config.update(change), expected, tmp_path)


def assert_refused_in_one_line(case: str, change, expected: str, tmp_path: Path) -> None:
    """The fixture's GGUF output with its config.json as `change` (a function of it) leaves it: refused while planning
    in one line holding `expected` and naming the file, nothing written."""
    import json

    src = SHIPPED / case / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    change(config)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    # (check=False: a dense layer the checkpoint lacks would fail the config check first; llama.cpp's checks stand)
    with pytest.raises(unshard.ConfigMismatchError) as refused:
        unshard.convert(
            src,
            tmp_path / "m.gguf",
            config_from=tmp_path / "hf",
            check=False,
            output=unshard.OutputOptions(gguf="auto"),
            progress=False,
        )
    assert expected in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert "config.json" in str(refused.value), refused.value
    assert not list(tmp_path.glob("*.gguf*")) and not leftovers(tmp_path)


def test_the_cli_says_a_refused_config_in_one_line(tmp_path):
    import json

    src = SHIPPED / "olmoe-fsdp2" / "global_step_1"
    unshard.convert(src, tmp_path / "hf", progress=False)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "norm_topk_prob": True}))
    code, _, err = run_cli(
        "convert", src, tmp_path / "m.gguf", "--config-from", tmp_path / "hf", "--no-progress", "--no-check"
    )
    assert code == 1 and f"{tmp_path / 'hf' / 'config.json'}: norm_topk_prob is set, and llama.cpp's olmoe" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "m.gguf").exists() and not leftovers(tmp_path)


def test_the_next_checkpoint_imports_no_transformers(tmp_path):
    """The config's defaults (transformers' AutoConfig, as the converter reads them) are asked once per config
    and remembered: the next GGUF conversion of the same model does not import transformers."""
    from conftest import convert_in_subprocess

    src = SHIPPED / "llama-fsdp2-spm" / "global_step_1"
    first = convert_in_subprocess(src, tmp_path / "1.gguf", tmp_path / "cache")
    second = convert_in_subprocess(src, tmp_path / "2.gguf", tmp_path / "cache")
    assert first[0] and not second[0]
    assert (tmp_path / "1.gguf").read_bytes() == (tmp_path / "2.gguf").read_bytes()


def test_an_existing_gguf_file_is_kept_unless_overwrite(tmp_path):
    src, out = SHIPPED / "llama-fsdp2-spm" / "global_step_1", tmp_path / "m.gguf"
    out.write_bytes(b"mine")
    code, _, err = run_cli("convert", src, out, "--no-progress")
    assert code == 1 and "already exists" in err and out.read_bytes() == b"mine"
    code, _, err = run_cli("convert", src, out, "--no-progress", "--overwrite")
    assert code == 0 and out.read_bytes()[:4] == b"GGUF" and not leftovers(tmp_path)
