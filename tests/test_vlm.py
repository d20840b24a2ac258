"""Vision-language models (Qwen2-VL, Qwen2.5-VL, Llama-3.2-Vision: built by transformers, sharded by FSDP2,
saved as verl does)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import unshard


@pytest.mark.parametrize("name", ["qwen2vl-fsdp2", "qwen25vl-fsdp2"])
def test_vision_language_model_loads_and_gives_the_same_logits(name, fixture_case, tmp_path):
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

    case = fixture_case(name)
    out = tmp_path / "out"
    unshard.convert(case / "global_step_1", out, progress=False)

    # transformers holds model.visual / model.language_model in memory and writes visual / model on
    # disk; the output has save_pretrained's names, so any release (and vLLM) reads it.
    model, info = AutoModelForImageTextToText.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    hf_files = case / "global_step_1" / "actor" / "huggingface"
    for name in ("preprocessor_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (hf_files / name).read_bytes(), name

    # An image and text, prepared by the processor files in OUT, through both models.
    image_processor, tokenizer = AutoImageProcessor.from_pretrained(out), AutoTokenizer.from_pretrained(out)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (56, 56, 3), dtype=np.uint8))
    pixels = image_processor(images=[image], return_tensors="pt")
    image_tokens = int(pixels["image_grid_thw"].prod()) // image_processor.merge_size**2
    text = "<|vision_start|>" + "<|image_pad|>" * image_tokens + "<|vision_end|>hello world"
    inputs = {**tokenizer(text, return_tensors="pt"), **pixels}
    # what the processor adds for M-RoPE: which tokens are image (1) tokens
    inputs["mm_token_type_ids"] = (inputs["input_ids"] == model.config.image_token_id).long()
    reference = AutoModelForImageTextToText.from_pretrained(case / "reference")
    with torch.no_grad():
        logits, expected = model(**inputs).logits, reference(**inputs).logits
    assert torch.equal(logits, expected)
    with torch.no_grad():  # the image matters: without it the logits differ
        assert not torch.equal(reference(**{**inputs, "pixel_values": pixels["pixel_values"] * 0}).logits, expected)


def test_llama_vision_converts_with_its_processor(fixture_case, tmp_path):
    """Llama-3.2-Vision (Mllama): cross-attention layers and a tiled vision encoder. The trainer saved
    the whole processor; AutoProcessor loads it from OUT and prepares the model's inputs there."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    case = fixture_case("mllama-fsdp2")
    out = tmp_path / "out"
    unshard.convert(case / "global_step_1", out, progress=False)

    # (test_fsdp_convert checks the tensors against save_pretrained's, as for every verl case.)
    hf_files = case / "global_step_1" / "actor" / "huggingface"
    assert (out / "processor_config.json").read_bytes() == (hf_files / "processor_config.json").read_bytes()

    processor = AutoProcessor.from_pretrained(out)
    assert type(processor).__name__ == "MllamaProcessor"
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8))  # two tiles
    inputs = processor(images=[image], text="<|image|>hello world", return_tensors="pt")
    model, info = AutoModelForImageTextToText.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    reference = AutoModelForImageTextToText.from_pretrained(case / "reference")
    with torch.no_grad():
        logits, expected = model(**inputs).logits, reference(**inputs).logits
        assert torch.equal(logits, expected)
        # the image reaches the text through the cross-attention layer
        assert not torch.equal(reference(**{**inputs, "pixel_values": inputs["pixel_values"] * 0}).logits, expected)
