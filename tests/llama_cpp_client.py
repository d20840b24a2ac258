"""llama.cpp itself (llama-cpp-python, compiled from its source package in the `llamacpp-client` peer venv), for
the GGUF tests.

    python llama_cpp_client.py run MODEL.gguf 1,5,20,33 OUT.npz NEW [LORA.gguf]
runs the file (with a LoRA adapter file applied, at scale 1, if given): OUT.npz gets `logits` (prompt length x
vocabulary) and `greedy` (NEW token ids, each the argmax of the logits after the last). Its keys and values are
cached in f16, as llama.cpp's default, or in f32 where KV_CACHE=f32.

    python llama_cpp_client.py quantize IN.gguf OUT.gguf TYPE [OUTPUT_TYPE]
is `llama-quantize [--output-tensor-type OUTPUT_TYPE] IN.gguf OUT.gguf TYPE` (TYPE: q4_0, q4_1, ..., q4_k_m), through
llama.cpp's own llama_model_quantize; with several types (TYPE,TYPE,...), OUT is a folder that gets TYPE.gguf each.

    python llama_cpp_client.py image MODEL.gguf MMPROJ.gguf WIDTH HEIGHT PIXELS.rgb OUT.npy
runs an image (PIXELS.rgb: WIDTH x HEIGHT RGB bytes, row by row) through llama.cpp's multimodal library (mtmd) as
llama-mtmd-cli does, with MMPROJ.gguf beside the text model: OUT.npy gets the image's embeddings, one row per token
of the image, as mtmd gives them to the text model (with a deepstack model's features of its tower's blocks after
the embedding, in the same row).

    python llama_cpp_client.py embed MODEL.gguf 2,5,20,3 OUT.npy
runs an embedding model's file (BERT's) over the tokens, its pooling none: OUT.npy gets each token's embedding, one row
per token, as llama.cpp's llama_get_embeddings_ith gives them.

    python llama_cpp_client.py seq2seq MODEL.gguf 5,20,33,1 7,9 OUT.npy
runs an encoder-decoder's file (T5's) as llama-cli does: the prompt encoded, then the decoder's start token and the
tokens given after it decoded: OUT.npy gets the logits at each decoder position (keys and values cached in f32).

    python llama_cpp_client.py rank MODEL.gguf 0,5,20,2 OUT.npy
runs a reranker's file (a sequence classifier's: XLM-RoBERTa's) over the tokens, its pooling llama.cpp's rank: OUT.npy
gets the classifier's scores of the sequence, as llama-server's rerank reads them.

    python llama_cpp_client.py pool MODEL.gguf 2,5,20,1 OUT.npy
runs an embedding model's file over the tokens, pooled as the file says (and projected after, where it has a
sentence-transformers model's Dense projections): OUT.npy gets the sequence's embedding, as llama-embedding gives it
before it normalizes.

    python llama_cpp_client.py eagle3 DRAFT.gguf FEATURES.npy 5,20,33 OUT.npz [TARGET.gguf]
runs an EAGLE-3 drafter's file as llama.cpp's draft-eagle3 speculative decoding does, without its target's hidden
states (and beside its target's file, whose embedding it reads, where the drafter has none of its own): each row of
FEATURES.npy (a token's three target hidden states, side by side) through its encoder, then each token with its row's
projection through its layer, at positions 0, 1, ...: OUT.npz gets `g` (the encoder's projections, one row per token)
and `logits` (the target vocabulary's, the draft tokens' placed at their target ids, -inf elsewhere).

    python llama_cpp_client.py dflash TARGET.gguf DRAFT.gguf FEATURES.npy 5,127,127,127 OUT.npz
runs a DFlash drafter's file as llama.cpp's draft-dflash speculative decoding does, beside its target's file (whose
embedding and head it reads): each row of FEATURES.npy (a context token's target hidden states, side by side) injected
into its cache at positions 0, 1, ..., then the block (the anchor token, then mask tokens) after them, attending both
ways (causally where the file says so): OUT.npz gets `logits` (the target vocabulary's, one row per block position; a
DSpark drafter's biased by its Markov head) and `nextn` (llama.cpp's nextn output, one row per block position:
DFlash2's selector lattice, each position's top-k candidate ids, then its scores by predecessor and candidate;
DSpark's confidence, across its row).

    python llama_cpp_client.py tokenize MODEL.gguf TEXTS.json OUT.json
tokenizes each text of TEXTS.json (a list) with the file's vocabulary, as llama.cpp does (no BOS, special tokens as
text): OUT.json gets a list of token id lists.
"""

import ctypes
import functools
import json
import os
import sys

import llama_cpp
import numpy as np


def run(path: str, prompt: list[int], out: str, new: int, lora: str | None = None) -> None:
    cache = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[os.environ.get("KV_CACHE", "f16")]
    llm = llama_cpp.Llama(
        model_path=path,
        logits_all=True,
        n_ctx=len(prompt) + new,
        n_threads=1,
        verbose=False,
        lora_path=lora,
        type_k=cache,
        type_v=cache,
        flash_attn=os.environ.get("FLASH_ATTN") == "1",
    )
    llm.eval(prompt)
    logits = np.array(llm.scores[: len(prompt)], dtype=np.float32)
    greedy = []
    for _ in range(new):
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(greedy[-1:])
    np.savez(out, logits=logits, greedy=np.array(greedy, dtype=np.int64))


def seq2seq(path: str, prompt: list[int], decoded: list[int], out: str) -> None:
    """An encoder-decoder's file (T5's) as llama-cli runs it: the prompt encoded, then the decoder's start token and
    the tokens given after it decoded; OUT.npy gets the logits at each of those, in f32 keys and values."""
    llm = llama_cpp.Llama(
        model_path=path,
        logits_all=True,
        n_ctx=max(len(prompt), len(decoded) + 1),
        n_batch=max(len(prompt), len(decoded) + 1),
        n_threads=1,
        verbose=False,
        type_k=llama_cpp.GGML_TYPE_F32,
        type_v=llama_cpp.GGML_TYPE_F32,
    )
    llm._batch.set_batch(prompt, n_past=0, logits_all=False)
    if llama_cpp.llama_encode(llm.ctx, llm._batch.batch) != 0:
        sys.exit(f"llama_encode failed on {path}")
    tokens = [llama_cpp.llama_model_decoder_start_token(llm.model), *decoded]
    llm._batch.set_batch(tokens, n_past=0, logits_all=True)
    llm._ctx.decode(llm._batch)
    width = llm.n_vocab()
    rows = [
        np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, i), shape=(width,)) for i in range(len(tokens))
    ]
    np.save(out, np.stack(rows).astype(np.float32))


def encoded(path: str, tokens: list[int], pooling: int):
    """The file's model after one pass over the tokens as one sequence, its embeddings pooled so."""
    llm = llama_cpp.Llama(
        model_path=path,
        embedding=True,
        pooling_type=pooling,
        n_ctx=len(tokens),
        n_batch=len(tokens),
        n_ubatch=len(tokens),
        n_threads=1,
        verbose=False,
        # (NON_CAUSAL=1: every token attends to every other, as llama-embedding's --attention non-causal)
        attention_type=llama_cpp.LLAMA_ATTENTION_TYPE_NON_CAUSAL
        if os.environ.get("NON_CAUSAL") == "1"
        else llama_cpp.LLAMA_ATTENTION_TYPE_UNSPECIFIED,
    )
    llm._batch.set_batch(tokens, n_past=0, logits_all=True)
    if llama_cpp.llama_model_has_encoder(llm.model):  # (T5's encoder alone: run as llama-embedding runs it)
        if llama_cpp.llama_encode(llm.ctx, llm._batch.batch) != 0:
            sys.exit(f"llama_encode failed on {path}")
    else:
        llm._ctx.decode(llm._batch)
    return llm


def embed(path: str, tokens: list[int], out: str) -> None:
    llm = encoded(path, tokens, llama_cpp.LLAMA_POOLING_TYPE_NONE)
    width = llama_cpp.llama_model_n_embd_out(llm.model)  # (the model's, or its Dense projection's: LFM2 ColBERT's)
    rows = [
        np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_ith(llm.ctx, i), shape=(width,))
        for i in range(len(tokens))
    ]
    np.save(out, np.stack(rows).astype(np.float32))


def rank(path: str, tokens: list[int], out: str) -> None:
    """A reranker's scores of one sequence, as llama-server's rerank pools it (the classifier head on the first
    token)."""
    llm = encoded(path, tokens, llama_cpp.LLAMA_POOLING_TYPE_RANK)
    scores = llama_cpp.llama_model_n_cls_out(llm.model)
    np.save(out, np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(llm.ctx, 0), shape=(scores,)).copy())


def pool(path: str, tokens: list[int], out: str) -> None:
    llm = encoded(path, tokens, llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
    width = llama_cpp.llama_model_n_embd_out(llm.model)
    np.save(out, np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(llm.ctx, 0), shape=(width,)).copy())


def quantize(source: str, out: str, file_type: str, output_type: str | None) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + file_type.upper())
    if output_type:
        params.output_tensor_type = getattr(llama_cpp, "GGML_TYPE_" + output_type.upper())
    params.nthread = int(os.environ.get("QUANTIZE_THREADS", "1"))  # (0: every core, as llama-quantize; the bench's)
    if llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize failed on {source}")


def image(model: str, mmproj: str, width: int, height: int, pixels: str, out: str) -> None:
    """The embeddings mtmd gives the text model for an image of width x height RGB pixels (a file of bytes)."""
    data = (ctypes.c_uint8 * os.path.getsize(pixels)).from_buffer_copy(open(pixels, "rb").read())
    media(model, mmproj, lambda mtmd: mtmd.mtmd_bitmap_init(width, height, data), out)


def audio(model: str, mmproj: str, samples: str, out: str) -> None:
    """The embeddings mtmd gives the text model for a sound (a file of float32 samples at 16 kHz)."""
    data = np.fromfile(samples, dtype=np.float32)
    pointer = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    media(model, mmproj, lambda mtmd: mtmd.mtmd_bitmap_init_from_audio(len(data), pointer), out)


def media(model: str, mmproj: str, bitmap_of, out: str) -> None:
    from llama_cpp import mtmd_cpp as mtmd

    llm = llama_cpp.Llama(model_path=model, n_ctx=64, n_threads=1, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, 1, False
    context = mtmd.mtmd_init_from_file(mmproj.encode(), llm.model, params)
    if not context:
        sys.exit(f"mtmd_init_from_file failed on {mmproj}")
    bitmap = bitmap_of(mtmd)
    marker = mtmd.mtmd_default_marker()
    text = mtmd.mtmd_input_text(marker, len(marker), False, True)
    chunks = mtmd.mtmd_input_chunks_init()
    if mtmd.mtmd_tokenize(context, chunks, ctypes.byref(text), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) != 0:
        sys.exit("mtmd_tokenize failed")
    images = [mtmd.mtmd_input_chunks_get(chunks, i) for i in range(mtmd.mtmd_input_chunks_size(chunks))]
    kinds = (mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE, mtmd.MTMD_INPUT_CHUNK_TYPE_AUDIO)
    images = [chunk for chunk in images if mtmd.mtmd_input_chunk_get_type(chunk) in kinds]
    width = llama_cpp.llama_model_n_embd_inp(llm.model)  # (the text's width, and deepstack's features after it)
    encoded = []  # (each chunk's embeddings in turn: an image cut into tiles is a chunk for each, its overview first)
    for chunk in images:
        if mtmd.mtmd_encode_chunk(context, chunk) != 0:
            sys.exit(f"mtmd did not encode the image ({len(images)} image chunks)")
        tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        embeddings = np.ctypeslib.as_array(mtmd.mtmd_get_output_embd(context), shape=(tokens * width,))
        encoded.append(embeddings.reshape(tokens, width).copy())
    if not encoded:
        sys.exit("mtmd made no image chunk of the image")
    np.save(out, np.concatenate(encoded))
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(context)


def nextn_functions():
    """llama.cpp's staging API of a drafter's extra outputs, by their C++ names (llama-ext.h's
    llama_set_embeddings_nextn and llama_get_embeddings_nextn): (set, get)."""
    lib = llama_cpp.llama_cpp._lib
    set_nextn = lib._Z26llama_set_embeddings_nextnP13llama_contextbb
    set_nextn.argtypes, set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    get_nextn = lib._Z26llama_get_embeddings_nextnP13llama_context
    get_nextn.argtypes, get_nextn.restype = [ctypes.c_void_p], ctypes.POINTER(ctypes.c_float)
    return set_nextn, get_nextn


def drafter_context(model, other=None, size: int = 16):
    """A context of `size` tokens, one thread, keys and values in f32; a drafter's beside its target's (`other`: its
    ctx_other, whose embedding and head it reads)."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = size
    params.n_threads = params.n_threads_batch = 1
    params.type_k = params.type_v = llama_cpp.GGML_TYPE_F32
    if other is not None:
        params.ctx_other = other
    return llama_cpp.llama_init_from_model(model, params)


def eagle3(path: str, features: str, tokens: list[int], out: str, target: str | None = None) -> None:
    """An EAGLE-3 drafter's encoder, then its decoder, through llama.cpp's extended batches (llama_process): each
    token's entry holds its id and its projection, as common/speculative.cpp gives them. A drafter without an embedding
    of its own reads its target's (target: its file, whose context is the drafter's ctx_other)."""
    set_nextn, get_nextn = nextn_functions()
    rows = np.ascontiguousarray(np.load(features), dtype=np.float32)
    floats = ctypes.POINTER(ctypes.c_float)
    n = len(tokens)

    context = functools.partial(drafter_context, size=max(n, 8))

    target_model = target and llama_cpp.llama_model_load_from_file(
        target.encode(), llama_cpp.llama_model_default_params()
    )
    target_ctx = target_model and context(target_model)
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    ctx = context(model, target_ctx)
    set_nextn(ctx, True, False)
    width = llama_cpp.llama_model_n_embd(model)
    batch = llama_cpp.llama_batch_ext_init(ctx)
    for i in range(n):
        row = rows[i]
        idx = llama_cpp.llama_batch_ext_add_embd(
            batch, 0, llama_cpp.llama_embd(row.ctypes.data_as(floats), 1, row.size)
        )
        llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(llama_cpp.llama_pos(i)))
        llama_cpp.llama_batch_ext_set_output_embd(batch, idx, True)
    assert llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, batch) == 0
    g = np.ctypeslib.as_array(get_nextn(ctx), shape=(n, width)).copy()
    llama_cpp.llama_batch_ext_clear(batch)
    for i, token in enumerate(tokens):
        idx = llama_cpp.llama_batch_ext_add_token(batch, 0, token)
        llama_cpp.llama_batch_ext_set_embd_token(
            batch, idx, llama_cpp.llama_embd(g[i].ctypes.data_as(floats), 1, width)
        )
        llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(llama_cpp.llama_pos(i)))
        llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
    assert llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
    vocabulary = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    logits = np.array(
        [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(vocabulary,)) for i in range(n)]
    )
    np.savez(out, g=g, logits=logits)
    llama_cpp.llama_batch_ext_free(batch)
    for free in (ctx, target_ctx):
        if free:
            llama_cpp.llama_free(free)
    for free in (model, target_model):
        if free:
            llama_cpp.llama_model_free(free)


def dflash(target: str, path: str, features: str, block: list[int], out: str) -> None:
    """A DFlash drafter beside its target's context (ctx_other: the target's embedding and head), through llama.cpp's
    extended batches as common/speculative.cpp drives it: the context's features injected, then the block decoded."""
    set_nextn, get_nextn = nextn_functions()
    rows = np.ascontiguousarray(np.load(features), dtype=np.float32)
    floats = ctypes.POINTER(ctypes.c_float)
    n = len(rows) + len(block)

    context = functools.partial(drafter_context, size=max(n, 16))

    target_model = llama_cpp.llama_model_load_from_file(target.encode(), llama_cpp.llama_model_default_params())
    target_ctx = context(target_model)
    model = llama_cpp.llama_model_load_from_file(path.encode(), llama_cpp.llama_model_default_params())
    ctx = context(model, target_ctx)
    assert ctx, "llama.cpp made no context of the drafter"
    set_nextn(ctx, True, False)
    causal = ctypes.create_string_buffer(8)  # (the file's say, as common/speculative.cpp reads it: else both ways)
    said = llama_cpp.llama_model_meta_val_str(model, b"dflash.attention.causal", causal, 8) >= 0
    llama_cpp.llama_set_causal_attn(ctx, said and causal.value == b"true")
    width = llama_cpp.llama_model_n_embd(model)
    batch = llama_cpp.llama_batch_ext_init(ctx)
    for i, row in enumerate(rows):
        idx = llama_cpp.llama_batch_ext_add_embd(
            batch, 0, llama_cpp.llama_embd(row.ctypes.data_as(floats), 1, row.size)
        )
        llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(llama_cpp.llama_pos(i)))
    assert llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
    llama_cpp.llama_batch_ext_clear(batch)
    for i, token in enumerate(block):
        idx = llama_cpp.llama_batch_ext_add_token(batch, 0, token)
        llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(llama_cpp.llama_pos(len(rows) + i)))
        llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
    assert llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
    vocabulary = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    logits = np.array(
        [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(vocabulary,)) for i in range(len(block))]
    )
    nextn = get_nextn(ctx)
    rows_out = np.ctypeslib.as_array(nextn, shape=(len(block), width)).copy() if nextn else np.zeros((0, width))
    np.savez(out, logits=logits, nextn=rows_out)
    llama_cpp.llama_batch_ext_free(batch)
    for free in (ctx, target_ctx):
        llama_cpp.llama_free(free)
    for free in (model, target_model):
        llama_cpp.llama_model_free(free)


def tokenize(model: str, texts: str, out: str) -> None:
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    with open(texts, encoding="utf-8") as f:
        ids = [llm.tokenize(text.encode(), add_bos=False, special=False) for text in json.load(f)]
    with open(out, "w") as f:
        json.dump(ids, f)


if sys.argv[1] == "tokenize":
    tokenize(sys.argv[2], sys.argv[3], sys.argv[4])
elif sys.argv[1] == "run":
    run(sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4], int(sys.argv[5]), *sys.argv[6:7])
elif sys.argv[1] == "eagle3":
    eagle3(sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4].split(",")], sys.argv[5], *sys.argv[6:7])
elif sys.argv[1] == "dflash":
    dflash(sys.argv[2], sys.argv[3], sys.argv[4], [int(i) for i in sys.argv[5].split(",")], sys.argv[6])
elif sys.argv[1] == "image":
    image(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7])
elif sys.argv[1] == "audio":
    audio(*sys.argv[2:6])
elif sys.argv[1] == "embed":
    embed(sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4])
elif sys.argv[1] == "seq2seq":
    seq2seq(
        sys.argv[2], [int(i) for i in sys.argv[3].split(",")], [int(i) for i in sys.argv[4].split(",")], sys.argv[5]
    )
elif sys.argv[1] in ("rank", "pool"):
    (rank if sys.argv[1] == "rank" else pool)(sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4])
elif "," in sys.argv[4]:
    for kind in sys.argv[4].split(","):
        quantize(sys.argv[2], f"{sys.argv[3]}/{kind}.gguf", kind, sys.argv[5] if len(sys.argv) > 5 else None)
else:
    quantize(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
