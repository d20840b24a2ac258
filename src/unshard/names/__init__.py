"""Names: a checkpoint's tensor names turned into those a Hugging Face model folder holds.

hf_names.py asks transformers (or its cache, known.py, or the written-down families, dense_families.py)
which names and shapes a config's model has; megatron_rules.py and meta_llama_rules.py are the tables
for Megatron-LM's and Meta's own names, and the splits of their fused tensors.
"""
