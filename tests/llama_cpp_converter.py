"""llama.cpp's convert_hf_to_gguf.py run as it is, in one process that converts one folder per line of its input,
for the tests' session: each run in a process of its own imports torch and transformers 4 again (5 s of a core), and
the GGUF tests run the converter some hundred times. A job may name the byte-level BPE pre-tokenizer: the converter
looks it up by a hash of one text's token ids among the models it knows, and a tokenizer trained for a test is none of
them. The rest of the vocabulary (tokens, types, merges, special tokens) is the converter's own.

One bug of the pinned converter is mended, as its code means it: StableLMModel.modify_tensors `return`s the generator of
a layer's stacked q and k norms (StableLM 2 12B's LayerNorm per head) from inside a generator, which drops it; the
converter then stops on "Unprocessed norms". Its stacks are yielded here. And EmbeddingGemma keeps the Dense modules it
reads in lists of its class, which a run in a process of its own starts empty: they are emptied before each job; as are
the RWKV models' token-shift mixes, which they keep by layer in a dict of their class until a layer's last; and
gguf-py's table of block tensors' names, which its TensorNameMap updates in place with an architecture's own names
(Qwen4-Exp's indexer norms over Hy4's): put back as it was before each job. That table has no name for Gemma 3n's
audio subsampling's norms (model.audio_tower.subsample_conv_projection.conv_N.norm, which transformers' Gemma 3n has),
so that its --mmproj stops on the first: they are named here as Gemma 4's of the same place (a.conv1d.N.norm), as
unshard names them; llama.cpp's mtmd reads none of Gemma 3n's audio tensors. And Gemma3nVisionAudioModel.modify_tensors
returns MobileNetV5's block tensors before the step that makes each layer scale (1, C, 1, 1), as it means to (layer
scales are the blocks' alone) and as mtmd multiplies by them (a vector of C stops it): they are made so here.

A job may also name converter classes that read a vocabulary only through its makers' tokenizer code (Hunyuan-A13B's
tiktoken file): for that job they read tokenizer.json as the converter reads any byte-level BPE (its
`_set_vocab_gpt2`), the folder's tokenizer being transformers' own.

    python llama_cpp_converter.py CONVERTER_FOLDER < jobs
    job, one JSON line:   {"pre": PRE_NAME or null, "args": [the converter's arguments...],
                           "gpt2_vocab": ["module.Class", ...] (optional)}
    reply, one JSON line: {"ok": true or false, "error": "the traceback's end"}
The converter's own output (its log, its prints) goes to standard error.
"""

import importlib
import json
import os
import runpy
import sys
import traceback

root = sys.argv[1]
sys.path.insert(0, root)
from conversion.base import TextModel, gguf  # noqa: E402  (the converter's own package, found in its folder)
from conversion.gemma import EmbeddingGemma, Gemma3nVisionAudioModel  # noqa: E402
from conversion.rwkv import Rwkv6Model, Rwkv7Model  # noqa: E402
from conversion.stablelm import StableLMModel  # noqa: E402

stablelm_own = StableLMModel.modify_tensors


def stablelm_with_stacks(self, data_torch, name, bid):
    stacked = yield from stablelm_own(self, data_torch, name, bid)  # (what the converter's generator returns)
    if stacked is not None:
        yield from stacked


StableLMModel.modify_tensors = stablelm_with_stacks
gemma3n_own = Gemma3nVisionAudioModel.modify_tensors


def gemma3n_with_layer_scales(self, data_torch, name, bid):
    for new_name, data in gemma3n_own(self, data_torch, name, bid):
        if new_name.startswith("v.blk.") and new_name.endswith(".layer_scale.gamma") and data.dim() == 1:
            data = data.reshape(1, -1, 1, 1)
        yield new_name, data


Gemma3nVisionAudioModel.modify_tensors = gemma3n_with_layer_scales

own_pre = TextModel.get_vocab_base_pre
block_names = {tensor: tuple(names) for tensor, names in gguf.TensorNameMap.block_mappings_cfg.items()}
block_names[gguf.MODEL_TENSOR.A_ENC_CONV1D_NORM] += ("model.audio_tower.subsample_conv_projection.conv_{bid}.norm",)
replies = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # (what the converter prints goes to standard error, and the replies alone to standard output)
sys.stdout = sys.stderr
for line in sys.stdin:
    job = json.loads(line)
    EmbeddingGemma.module_paths, EmbeddingGemma.dense_features_dims = [], {}
    Rwkv6Model.lerp_weights, Rwkv7Model.lerp_weights = {}, {}
    gguf.TensorNameMap.block_mappings_cfg.clear()
    gguf.TensorNameMap.block_mappings_cfg.update(block_names)
    TextModel.get_vocab_base_pre = (lambda self, tokenizer, pre=job["pre"]: pre) if job["pre"] else own_pre
    sys.argv = [os.path.join(root, "convert_hf_to_gguf.py"), *job["args"]]
    own_vocab = {}
    for path in job.get("gpt2_vocab") or ():
        module, _, name = path.rpartition(".")
        cls = getattr(importlib.import_module(f"conversion.{module}"), name)
        own_vocab[cls], cls.set_vocab = cls.__dict__["set_vocab"], TextModel._set_vocab_gpt2
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        ok, error = True, ""
    except SystemExit as e:  # (the converter's main exits 1 on what it refuses, having logged why)
        ok, error = e.code in (0, None), f"the converter exited with {e.code}"
    except Exception:
        ok, error = False, traceback.format_exc()
    for cls, set_vocab in own_vocab.items():
        cls.set_vocab = set_vocab
    replies.write(json.dumps({"ok": ok, "error": error[-3000:]}) + "\n")
    replies.flush()
