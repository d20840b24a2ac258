"""Write a base model and two fine-tunes as Hugging Face folders of about GB each, for the merge benchmark.

    python bench/make_models.py --gb 1 --out DIR      # DIR/base, DIR/ft0, DIR/ft1, DIR/recipe.yml

transformers builds the model (meta device, then random weights); save_pretrained writes it. The
fine-tunes are the base plus seeded noise; the recipe is a TIES merge of both onto the base.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from make_checkpoint import FFN, HIDDEN, VOCAB, layers_for


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, required=True, help="approximate fp32 size of each model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=FFN,
        num_hidden_layers=layers_for(args.gb),
        num_attention_heads=16,
        num_key_value_heads=4,
        dtype=torch.float32,
        tie_word_embeddings=False,
    )
    out = Path(args.out)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02, generator=generator)
    model.save_pretrained(out / "base")
    for i in range(2):  # ft1 is base + noise0 + noise1: fine-tunes that share some of their update
        noise = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=noise) * 0.002)
        model.save_pretrained(out / f"ft{i}")
    (out / "recipe.yml").write_text(
        f"merge_method: ties\nbase_model: {out / 'base'}\nmodels:\n"
        f"  - model: {out / 'ft0'}\n    parameters: {{weight: 0.6, density: 0.5}}\n"
        f"  - model: {out / 'ft1'}\n    parameters: {{weight: 0.4, density: 0.5}}\n"
        "parameters: {normalize: true}\ndtype: float32\n"
    )


if __name__ == "__main__":
    main()
