"""Names: a checkpoint's tensor names turned into those a Hugging Face model folder holds.

hf_names.py asks transformers (or its cache, known.py, or the family's written-down tensors, dense_tables.py)
which names and shapes a config's model has; megatron_rules.py and meta_rules.py are the machinery of the
families' tables for Megatron-LM's and Meta's own names (the tables themselves are the families', families/).
"""
