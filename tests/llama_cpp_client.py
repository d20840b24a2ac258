"""Runs a GGUF file through llama.cpp itself (llama-cpp-python, compiled from its source package in the
`llamacpp-client` peer venv): the logits of every position of a prompt, and its greedy continuation.

    python llama_cpp_client.py MODEL.gguf 1,5,20,33 OUT.npz NEW

OUT.npz gets `logits` (prompt length x vocabulary) and `greedy` (NEW token ids, each the argmax of the logits
after the last).
"""

import sys

import llama_cpp
import numpy as np

path, prompt, out, new = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], sys.argv[3], int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, logits_all=True, n_ctx=len(prompt) + new, n_threads=1, verbose=False)
llm.eval(prompt)
logits = np.array(llm.scores[: len(prompt)], dtype=np.float32)
greedy = []
for _ in range(new):
    greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
    llm.eval(greedy[-1:])
np.savez(out, logits=logits, greedy=np.array(greedy, dtype=np.int64))
