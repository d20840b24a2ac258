"""GGUF: the one file llama.cpp reads (and Ollama, LM Studio, llama-cpp-python with it).

The file is what llama.cpp's own `convert_hf_to_gguf.py` writes from the Hugging Face folder unshard
would have written (same dtype), without that folder: the header (metadata, tensor infos, aligned
offsets) comes from the plan, then each tensor is converted a band of rows at a time and written to
its place. The format's constants, names, metadata writer and quantization kernels are gguf-py's
(llama.cpp's own Python library); what is written here is which of them the converter uses, and when.
What differs between families (llama.cpp's architecture, the header's hooks, q/k order, norms) each family
declares in its GGUFPart (families/<family>.py); `unshard families` lists the ones written.

- header.py: what every family's header shares (the config as the converter reads it, general key-values,
  the TextModel's hyper-parameters, rope); vocabulary.py: the tokenizer's part of the header;
  pre_tokenizer_hashes.py: the converter's own table of pre-tokenizers, where the user has a llama.cpp checkout.
- model.py: what the config alone says (architecture, family part, refusals), before names are asked or weights read.
- tensors.py: the plan's values (each tensor's encoding, the file's types and positions); plan.py: planning them;
  kquants.py: llama-quantize's K-quant mixes.
- file.py: the one module that touches gguf-py's writer internals (header bytes, the file, reading it back);
  reading.py: a written file's tensor infos, read from its header for --verify.
- vision.py: a vision-language model's second file, the mmproj.
- sink.py: the output format (a types.Sink) and its staging, as sinks.FORMATS finds it.

The types are f32, f16, bf16 and q8_0 (the converter's own), and q4_0, q4_1, q5_0 and q5_1 as llama-quantize
makes them from the converter's file (LEGACY), and its K-quant mixes (kquants.py: its choice of each tensor's
type, and llama.cpp's own kernels, called in its library).
"""
