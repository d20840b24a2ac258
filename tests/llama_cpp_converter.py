"""llama.cpp's convert_hf_to_gguf.py run as it is, but for the name of a BPE tokenizer's pre-tokenizer, which
the caller gives: the converter looks it up by a hash of one text's token ids among the models it knows, and a
tokenizer trained for a test is none of them. The rest of the vocabulary (tokens, types, merges, special
tokens) is the converter's own.

    python llama_cpp_converter.py CONVERTER_FOLDER PRE_NAME [the converter's arguments...]
"""

import runpy
import sys

root, pre, args = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path.insert(0, root)
from conversion.base import TextModel  # noqa: E402  (the converter's own package, found in its folder)

TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [f"{root}/convert_hf_to_gguf.py", *args]
runpy.run_path(sys.argv[0], run_name="__main__")
