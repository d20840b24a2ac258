"""llama.cpp itself (llama-cpp-python, compiled from its source package in the `llamacpp-client` peer venv), for
the GGUF tests.

    python llama_cpp_client.py run MODEL.gguf 1,5,20,33 OUT.npz NEW
runs the file: OUT.npz gets `logits` (prompt length x vocabulary) and `greedy` (NEW token ids, each the argmax
of the logits after the last).

    python llama_cpp_client.py quantize IN.gguf OUT.gguf TYPE [OUTPUT_TYPE]
is `llama-quantize [--output-tensor-type OUTPUT_TYPE] IN.gguf OUT.gguf TYPE` (TYPE: q4_0, q4_1, ...), through
llama.cpp's own llama_model_quantize.
"""

import ctypes
import sys

import llama_cpp
import numpy as np


def run(path: str, prompt: list[int], out: str, new: int) -> None:
    llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=len(prompt) + new, n_threads=1, verbose=False)
    llm.eval(prompt)
    logits = np.array(llm.scores[: len(prompt)], dtype=np.float32)
    greedy = []
    for _ in range(new):
        greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval(greedy[-1:])
    np.savez(out, logits=logits, greedy=np.array(greedy, dtype=np.int64))


def quantize(source: str, out: str, file_type: str, output_type: str | None) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + file_type.upper())
    if output_type:
        params.output_tensor_type = getattr(llama_cpp, "GGML_TYPE_" + output_type.upper())
    params.nthread = 1
    if llama_cpp.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) != 0:
        sys.exit(f"llama_model_quantize failed on {source}")


if sys.argv[1] == "run":
    run(sys.argv[2], [int(i) for i in sys.argv[3].split(",")], sys.argv[4], int(sys.argv[5]))
else:
    quantize(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] if len(sys.argv) > 5 else None)
