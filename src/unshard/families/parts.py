"""What a family module declares: the Family, and the kinds of its parts.

Each part is what one path of unshard needs to know of the family: its value, or `Unsupported(reason)`, the
one line that path says when it refuses the family (and that `unshard families` shows). No part is left out:
a Family cannot be made without every one of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from ..names.megatron_rules import Signature


@dataclass(frozen=True)
class Unsupported:
    """A part a family does not have, and why: what the path that needs it says, and `unshard families` shows.
    `applies` False: the family cannot have it (a text model's vision part), which the matrix shows as such."""

    reason: str
    applies: bool = True


@dataclass(frozen=True)
class MegatronRules:
    """How Megatron names the family's tensors (names.megatron_rules' rule kinds), how its args say it is this
    family, and what config.json it becomes."""

    rules: dict[str, Any]  # Megatron name, layer as {i} and expert as {e} -> the Hugging Face name(s), with its kind
    # what Megatron-LM's args say of the family (names.megatron_rules.Signature); None: known by its config alone
    signature: Signature | None
    config: Callable[[dict[str, Any]], dict[str, Any]] = lambda args: {}  # config.json's own keys, from the args
    # The other way (--to megatron): the family's own Megatron-LM args from config.json (latent attention's ranks and
    # its rotary embedding), over those every family has; raises CheckpointError for a config they cannot say.
    args: Callable[[dict[str, Any]], dict[str, Any]] = lambda config: {}
    # (no signature: the family Megatron-LM's args would describe instead, which it is read as without --config-from)
    read_as: str = "a Llama"


@dataclass(frozen=True)
class Rearrangement:
    """One Hugging Face tensor the converter stores otherwise than as it is (sinks/gguf's Rearranged): the tensors it
    becomes, by the Hugging Face-like names the converter maps to llama.cpp's (in its order), with their shapes, and
    the module function (or a partial of one: it goes to writer processes by pickle) that cuts each band of
    `rows_per_band` whole rows, as numpy, into their pieces."""

    tensors: dict[str, tuple[int, ...]]
    pieces: Callable[[Any], tuple[Any, ...]]
    rows_per_band: int = 1


def one_kv_head(hparams: dict) -> int:
    """GGUFPart.first_kv_heads of latent attention computed as MQA (llama.cpp's deepseek2)."""
    return 1


def renamed_only(band) -> tuple:
    """A Rearrangement's pieces for a tensor stored as it is under another name (one piece: the band itself)."""
    return (band,)


def rows_of_each_head(band, order: tuple[int, ...]) -> tuple:
    """A Rearrangement's pieces for a tensor of whole heads stored with each head's rows in `order` (as many as a head
    has): the rotary rows of a family that transformers turns in one order and llama.cpp in another (bind the order,
    computed once while planning, with functools.partial)."""
    heads = band.reshape(-1, len(order), *band.shape[1:])
    return (heads[:, list(order)].reshape(band.shape),)


def pairs_from_halves(head_rows: int, rotated: int, first: int) -> tuple[int, ...]:
    """The order of a head's rows that takes its `rotated` rows from `first` on from transformers' order (turned by
    halves: row i with row i + rotated / 2) into llama.cpp's (turned by consecutive pairs), the others as they are."""
    half = rotated // 2
    turned = (first + row for pair in zip(range(half), range(half, rotated)) for row in pair)
    return (*range(first), *turned, *range(first + rotated, head_rows))


def gate_then_up(band) -> tuple:
    """A Rearrangement's pieces for gate and up fused (gate's rows, then up's: Granite MoE's experts, Gemma 4's): each
    expert's rows as its gate's half and its up's."""
    half = band.shape[-2] // 2
    return band[..., :half, :], band[..., half:, :]


def fused_experts_as_linear(name: str, shape: tuple[int, ...], hparams: dict, where: Path) -> Rearrangement | None:
    """A Family's `linearized` for transformers 5's fused experts (gate_up_proj [experts, 2 x width, dim], gate's rows
    then up's; down_proj [experts, dim, width]: Gemma 4 26B-A4B's, Mistral 4's), as llm-compressor makes Linear
    layers of them before quantizing: each expert's gate_proj, up_proj and down_proj, one expert after the other."""
    if name.endswith(".experts.down_proj"):
        return Rearrangement({name + ".weight": shape}, renamed_only)
    if not name.endswith(".experts.gate_up_proj"):
        return None
    experts, both, hidden = shape
    halves = (experts, both // 2, hidden)
    stack = name.removesuffix("gate_up_proj")
    return Rearrangement({stack + "gate_proj.weight": halves, stack + "up_proj.weight": halves}, gate_then_up)


def middle_axis_dropped(band) -> tuple:
    """A Rearrangement's pieces for a tensor stored without its middle axis of one (a depthwise convolution's
    kernel)."""
    return (band.reshape(band.shape[0], band.shape[-1]),)


def negated_exp(band):
    """-exp of a band, by torch's exp as the converter computes it (numpy's may round otherwise): a state-space
    layer's A from its A_log."""
    import numpy as np
    import torch

    return (-torch.exp(torch.from_numpy(np.ascontiguousarray(band)))).numpy()


def channels_first(patch: int, band):
    """Rows of a patch embedding (a linear layer over each patch's pixels, as (patch, patch, channels)) as the converter
    stores them, (channels, patch, patch): a 2-D convolution's kernel."""
    return (band.reshape(len(band), patch, patch, -1).transpose(0, 3, 1, 2),)


def pixels_channels_first(patch: int, band) -> tuple:
    """A Rearrangement's pieces for a tensor whose last axis runs over a patch's pixels as (patch, patch, channels),
    stored along that axis as (channels, patch, patch), the order ggml's im2col gives them (Gemma 4 Unified's patch
    projection and the norm before it); channels_first's order, the axis kept whole."""
    pixels = band.reshape(*band.shape[:-1], patch, patch, -1)
    return (pixels.transpose(*range(band.ndim - 1), -1, -3, -2).reshape(band.shape),)


def prefix_renamed(prefixes: tuple[tuple[str, str], ...], name: str) -> str:
    """A tensor's name with the first of `prefixes` it starts with replaced ((prefix, replacement) pairs), else as it
    is: a MmprojPart's converter_name where the converter renames a family's towers (bind them with partial)."""
    for prefix, renamed in prefixes:
        if name.startswith(prefix):
            return renamed + name.removeprefix(prefix)
    return name


def patch_embedding_as_convolution(name: str, shape: tuple[int, ...]) -> Rearrangement:
    """A patch embedding that is a linear layer over each patch's RGB pixels (Gemma 4's, SigLIP2's), as the converter
    stores it: a 2-D convolution's kernel, the patch's side from its width."""
    embedding, pixels = shape
    patch = int((pixels // 3) ** 0.5)
    return Rearrangement({name: (embedding, 3, patch, patch)}, partial(channels_first, patch))


def softplus(band):
    """softplus of a band, by torch's as the converter computes it: Gemma 4's audio attention's per-dimension scales."""
    import numpy as np
    import torch

    return torch.nn.functional.softplus(torch.from_numpy(np.ascontiguousarray(band))).numpy()


def transposed(band) -> tuple:
    """A Rearrangement's pieces for a stack of matrices stored transposed (one piece: each matrix's transpose)."""
    return (band.swapaxes(-1, -2),)


@dataclass(frozen=True)
class GGUFPart:
    """How llama.cpp's converter writes the family (sinks/gguf): its architecture and the family's header hooks."""

    arch: str  # gguf.MODEL_ARCH's member
    # (writer, hparams, ftype, blocks, folder): the hyper-parameters in the converter's order; None: its TextModel's
    hyperparameters: Callable[..., None] | None = None
    # (writer, hparams): keys the converter writes as it opens the file, right after the architecture (DeepSeek-OCR's
    # default chat template, whose value the tokenizer's, where the folder has one, replaces in its place; an EAGLE-3
    # drafter's target layers)
    opening_keys: Callable[..., None] | None = None
    # (hparams, where, given folder or None) -> the folder of the model a drafter drafts for, whose vocabulary the file
    # holds and whose config the converter reads (EAGLE-3's: its --target-model-dir); hparams gets its config as
    # "target_config"
    target: Callable[..., Path] | None = None
    # the vocabulary as the target's family writes it, as the converter reads it by the target's class (its DFlash and
    # DSpark drafters'), before the drafter's own after_vocabulary; else the drafter's own part's (its EAGLE-3's)
    vocabulary_of_target: bool = False
    # (writer, hparams, folder): what the converter writes before the vocabulary (ModernBERT's start, end and separator
    # flags) and after it (special tokens, the space prefix)
    before_vocabulary: Callable[..., None] | None = None
    after_vocabulary: Callable[..., None] | None = None
    # (writer, hparams, rope, head_dim, where) -> tensors the converter computes from the config (rope factors)
    computed: Callable[..., dict[str, list[float]]] | None = None
    # (writer, hparams, folder) -> tensors the converter reads from beside the model, by llama.cpp's names, as float32
    # arrays (sentence-transformers' Dense modules: EmbeddingGemma's, LFM2's), first in the file, each in the type the
    # file gives a matrix; the keys it writes with them, first in the header where the converter writes them so
    beside_model: Callable[..., dict[str, Any]] | None = None
    permute_qk: bool = False  # q and k rows reordered per head (llama.cpp's llama rotates pairs, as Meta's code)
    norm_shift: float = 0.0  # added to every norm weight (Gemma's 1 + weight, which llama.cpp applies as it is)
    unshifted_norms: tuple[str, ...] = ()  # the ends of norms' names the shift skips (those applied as they are)
    # (hparams, where): refuses a config llama.cpp would compute otherwise than transformers (Qwen MoE's routing,
    # SmolLM3's layers without rotary embeddings); returns what the conversion notes of a smaller difference, or None
    check_config: Callable[..., list[str] | None] | None = None
    # auto: SentencePiece where there is a tokenizer.model, else BPE; bpe: tokenizer.json only; gemma4: Gemma 4's;
    # wordpiece: BERT's; xlm-roberta and t5: their SentencePiece unigrams (llama.cpp's t5 tokenizer); internlm3:
    # SentencePiece with InternLM3's space prefix and end token; internlm2: InternLM2's SentencePiece vocabulary
    # (sinks/gguf/internlm2_vocabulary.py); rwkv: the RWKV world vocabulary
    vocabulary: str = "auto"
    # the converter's name of this family's byte-level BPE where its split is GPT-2's (RoBERTa's `roberta-bpe`, by
    # which llama.cpp ends a sequence with its separator), by the hash its table lists for the family's tokenizers
    gpt2_split_as: str | None = None
    llama_vocabulary: bool = False  # the converter's LlamaModel's vocabulary: its space prefix
    phi3_tokens: bool = False  # (Phi-3's tokenizer, as the converter reads it)
    # (name, shape, hparams, where) -> how the converter stores that tensor otherwise than as it is, or None
    rearranged: Callable[..., Rearrangement | None] | None = None
    # a regular expression over a Hugging Face name -> what the converter maps instead (re.sub's replacement)
    renames: tuple[tuple[str, str], ...] = ()
    dropped_prefix: str = ""  # the start of every name the converter drops before it maps them (BLOOM's)
    # the order the converter writes a block's expert stacks in (by the experts' tensors' names: gate_proj, ...); ()
    # the order of their names
    expert_stack_order: tuple[str, ...] = ()
    # A regular expression matching the Hugging Face tensors the converter stacks into one of the file's tensors, in
    # three groups: the stack's name before the index, the index, the rest (Gemma 3n's AltUp projections)
    stacked: str | None = None
    # the members of the family's stacks in the converter's order, where they are named, not numbered (RWKV-7's
    # token-shift mixes: r, w, k, v, a, g)
    stack_order: tuple[str, ...] = ()
    # the family's stacks joined by their rows where the converter concatenates them, not stacked on a new axis
    # (Qwen4-Exp's n-gram table, which transformers saves in shards of rows)
    joined_rows: bool = False
    # (name, shape, hparams) -> the rows of the file's tensor where the converter pads it with zero rows after the
    # tensor's own (Gemma 3n's embeddings, to the vocabulary's image and audio tokens), else None
    padded_rows: Callable[..., int | None] | None = None
    # (hparams) -> tensors llama.cpp loads that the model has none of and does not compute with, by llama.cpp's names
    # and shapes: written as zeros in F32 where the model lacks them, with a note (Gemma 3n's shared layers' keys and
    # values, which transformers 5 builds no weights for and the Hub's checkpoints hold)
    unused: Callable[[dict], dict[str, tuple[int, ...]]] | None = None
    # (hparams) -> the key-value heads of the file's first layer where not the config's, which llama-quantize's mixes
    # choose by: 1 where llama.cpp computes latent attention as MQA (deepseek2), 0 for a recurrent layer (Kimi Linear)
    first_kv_heads: Callable[[dict], int] | None = None
    # special tokens the converter sets by their text where tokenizer_config.json names none of that kind (GLM's)
    special_tokens: tuple[tuple[str, str], ...] = ()
    # added tokens the converter lists as control tokens whatever the tokenizer says of them (Laguna's end of turn)
    control_tokens: tuple[str, ...] = ()
    # kinds of special token the vocabulary leaves unnamed whatever the folder's files say, as the converter, which
    # names them later from elsewhere (a drafter's mask token, from its target's config: after_vocabulary writes it)
    unnamed_special_tokens: tuple[str, ...] = ()
    # the config's count of blocks after the model's own that the file has room for (GLM's MTP layers, which
    # llama.cpp loads where they are and goes without where they are not)
    extra_blocks: str | None = None
    # (hparams, where) -> the config as the converter reads it, where transformers reads it otherwise (Nemotron-H's:
    # the converter's transformers has no nemotron_h, so it reads config.json as the Hub writes it)
    as_the_converter_reads: Callable[..., dict] | None = None
    # (hparams) -> gguf.MODEL_ARCH's member where the converter chooses by the config (Nemotron-H's with experts), else
    # None: `arch`
    arch_by_config: Callable[[dict], str | None] | None = None
    # a regular expression matching a vision-language model's towers (by the output's names) where unshard writes no
    # mmproj file of them (EXAONE 4.5's vision tower): left out of the text model's file, as the converter does
    towers: str | None = None
    # why no file holds them where the mmproj file holds the rest (Janus-Pro's image generator); else the mmproj
    # part's reason
    towers_left_out: str = ""
    # the MoE routers in the file's type where the converter writes them (it forces every matrix into it: DBRX's);
    # llama-quantize's types keep them as its f32 input has them
    routers_in_file_type: bool = False
    # parts of llama.cpp's names of tensors the converter writes in F32 whatever the file's type (MiniMax-M3's
    # indexer); llama-quantize's types choose as they do for any
    kept_in_f32: tuple[str, ...] = ()
    # parts of llama.cpp's names of tensors llama-quantize leaves as the converter's f32 file has them for this
    # architecture, and of those it quantizes to no fewer bits than Q8_0 (GLM-5-Next's mixing matrices, its indexer's
    # and latent's projections)
    left_by_llama_quantize: tuple[str, ...] = ()
    q8_0_or_more: tuple[str, ...] = ()
    # A regular expression matching tensors whose values the converter writes into the header, not the file, and
    # (writer, {output name: its values}, hparams, where) -> those key-values, added first (the converter adds them
    # while reading the tensors, before its other metadata): Apertus's xIELU parameters of each layer; None: the
    # hyperparameters hook writes them where the converter does, from hparams["header_tensors"] (Qwen4-Exp's hash)
    header_tensors: str | None = None
    header_from_tensors: Callable[..., None] | None = None
    # A regular expression matching tensors the converter reads whole and writes after every other, as it makes them,
    # and ({output name: values}, hparams, where) -> those it writes, by llama.cpp's names, as numpy arrays of their
    # own type (an EAGLE-3 drafter's draft-to-target map, as int64 target ids); the others it leaves out (its
    # target-to-draft map)
    written_last: str | None = None
    last_from_tensors: Callable[..., dict[str, Any]] | None = None
    # (name, shape, hparams) -> the converter's multiplications of that tensor by the config's numbers, in order:
    # (first row, end row, factor) each, in the tensor's dtype as torch multiplies (Falcon-H1's muP multipliers, which
    # it folds into the weights); () or None: none
    scaled: Callable[..., tuple[tuple[int, int, float], ...]] | None = None
    # Tensors the converter's file leaves out, each (a regular expression of their names, why; a note says how many
    # and why): MiniMax-01's decay tables, which transformers saves and the model computes from its config; RWKV-7's
    # dummy first-layer v projections, which some conversions keep and no layer 0 computes
    skipped: tuple[tuple[str, str], ...] = ()
    # the tokens past the tokenizer's own whose embedding rows are zero, which the converter's file suppresses (the
    # padding of MiniMax-01's vocabulary): the plan reads those rows and gives the hyperparameters hook their ids in
    # hparams["zero_embedding_tokens"]
    suppresses_zero_embeddings: bool = False
    # the ends of Hugging Face names of vectors the converter writes less their mean (Sarvam's experts' correction
    # bias, which its loader centres: the same choice of experts)
    centred: tuple[str, ...] = ()
    # (text_config's model_type, the part): a vision-language model whose text model the converter writes as another
    # layout by that type (Mistral 3 around Mistral 4's text model: DeepSeek-V2's, llama.cpp's mistral4)
    text_models: tuple[tuple[str, GGUFPart], ...] = ()
    # (class config.json names, the part): a class of the family whose head the file holds otherwise (BERT's sequence
    # classifier: its pooler as llama.cpp's cls)
    classes: tuple[tuple[str, GGUFPart], ...] = ()

    def for_text_model(self, model_type: str | None) -> GGUFPart:
        """The part that writes a text model of this type: its own, unless `text_models` names another."""
        return dict(self.text_models).get(model_type, self)

    def for_class(self, architecture: str | None) -> GGUFPart:
        """The part that writes a model of this class: its own, unless `classes` names another."""
        return dict(self.classes).get(architecture, self)


@dataclass(frozen=True)
class MmprojPart:
    """How llama.cpp's converter writes the family's towers (vision, audio) and projectors as the mmproj file, with
    `--mmproj` (sinks/gguf/vision.py): which tensors, their names and types, the vision keys and the projector's."""

    projector: str  # gguf.VisionProjectorType's member
    vision: str  # a regular expression matching the towers' and projectors' tensors (by the output's names)
    # (vision_config, where) -> it as the converter's MmprojModel reads it: image_size, patch_size, hidden_size,
    # intermediate_size, num_hidden_layers, num_attention_heads (renamed, defaulted); refuses what llama.cpp lacks.
    # None: the model has no vision tower (an audio tower alone: Qwen2-Audio's)
    sizes: Callable[[dict, Any], dict] | None
    # (writer, hparams, vision sizes or None, processor): the projector's keys, after the towers' sizes
    projector_keys: Callable[..., None]
    # (gguf, the converter's name, llama.cpp's name, shape, the file's type, its name) -> the converter's type for
    # the tensor where the family forces one (patch embeddings, projections), else None
    forced_type: Callable[..., Any] | None = None
    converter_name: Callable[[str], str] | None = None  # a tensor's name as the converter maps it (its renames)
    # (name, shape, sizes) -> how the converter stores that tensor otherwise than as it is (Qwen's qkv split; its
    # Conv3D patch embedding as two 2-D ones; tensors it names itself, as in the file), or None
    rearranged: Callable[[str, tuple[int, ...], dict], Rearrangement | None] | None = None
    permute_qk: bool = False  # q's and k's rows reordered within each head, as the converter's LlamaModel.permute
    # (hparams, folder) -> rows of the text model's tensors the mmproj file carries: {llama.cpp's name: (the text
    # file's tensor, its row)} (Pixtral's [IMG_BREAK] embedding)
    text_rows: Callable[[dict, Any], dict[str, tuple[str, int]]] | None = None
    # (config, where) -> the audio tower's sizes as the converter's MmprojModel reads them (hidden_size,
    # intermediate_size, num_hidden_layers, num_attention_heads), or None where the model has none; the file then holds
    # both towers (Gemma 4's E2B and E4B). Refuses a tower llama.cpp computes otherwise
    audio_sizes: Callable[[dict, Any], dict | None] | None = None
    # where the projector's type goes: clip's key; clip.vision's (a file that may hold an audio part beside: Gemma
    # 4's); clip.audio's, after the projector's keys (an audio tower the converter writes as one of a pair: Qwen3-ASR's)
    projector_type_key: str = "clip"
    # (the vision and the audio tower's sizes, None where there is none) -> tensors the converter computes rather than
    # reads, by llama.cpp's names, first in the file (Qwen3-ASR's sinusoidal positions), or None
    computed: Callable[[dict | None, dict | None], dict[str, Any]] | None = None
    # A regular expression matching the tensors the converter folds several into one (Granite Speech's batch norms:
    # weight, bias and running statistics), and {their output name: values} -> {each tensor it makes, by a name it
    # maps: (its values, the input after which the converter writes it)}
    folds: str | None = None
    fold: Callable[[dict[str, Any]], dict[str, tuple[Any, str]]] | None = None
    # what the conversion notes of the file: how llama.cpp's graph computes otherwise than transformers, whatever the
    # file says (Llama 4's tokens, column by column), or None
    note: str | None = None
    # the image's mean and standard deviation the converter writes whatever the image processor says (Gemma 3n's: its
    # MobileNetV5 takes the pixels as they are), or None: the processor's image_mean and image_std
    image_normalisation: tuple[list[float], list[float]] | None = None


# (a family's GGUF note where llama.cpp's architecture is newer than PyPI's gguf-py)
LLAMA_CPP_GGUF_PY = "with llama.cpp's own gguf-py (PyPI's 0.19 lacks {arch}): pip install <llama.cpp>/gguf-py"

# Linear layers that vLLM runs as one, for a model of a family not listed (and the vision-language models, whose
# towers name theirs otherwise): the common names, as llm-compressor's FUSED_LAYER_NAMES (q, k and v; gate and up,
# as Mixtral's w1 and w3; DeepSeek's q_a and kv_a).
DEFAULT_FUSED_SIBLINGS = (
    ("gate_proj", "up_proj"),
    ("q_proj", "k_proj", "v_proj"),
    ("q_a_proj", "kv_a_proj_with_mqa"),
    ("w1", "w3"),
)

# merge-moe: a config setting that is the dense model's intermediate size
INTERMEDIATE = object()
# Where a family's state dict is not written down in its module (a TensorTable): transformers is asked
NO_TABLE = Unsupported("not written down: transformers is asked once per config (then remembered)")
# Where a dense family is none of merge-moe's inputs (moe_layout)
NOT_A_MOE_INPUT = Unsupported("a dense family merge-moe does not assemble from", applies=False)
# Where neither trainer's release has a model of the family (torchtitan 0.3: Llama 3, Qwen3, Qwen3-MoE, DeepSeek-V3,
# gpt-oss, Qwen3.5, Qwen3.5-MoE, Kimi K2.5; torchtune 0.6.1: Llama, Mistral, Qwen2, Gemma, Gemma 2, Phi-3/Phi-4, Llama
# 3.2 Vision), its names to read and write do not apply
NO_META_NAMES = Unsupported(
    "torchtitan (0.3) and torchtune (0.6.1, its last release) have no model of this family", applies=False
)
NO_TORCHTITAN_NAMES = Unsupported("torchtitan (0.3) has no model of this family", applies=False)
NO_TORCHTUNE_MODEL = Unsupported("torchtune (0.6.1, its last release) has no model of this family", applies=False)


def no_trainer_model(name: str) -> dict[str, Unsupported]:
    """The parts of a family that neither torchtitan (0.3) nor torchtune (0.6.1) has a model of: no names to read
    or write, which the matrix shows as not applying."""
    return dict(
        meta_names=Unsupported(f"torchtitan and torchtune have no {name} model", applies=False),
        torchtitan_names=Unsupported(f"torchtitan has no {name} model", applies=False),
        torchtune_names=Unsupported(f"torchtune has no {name} model", applies=False),
    )


@dataclass(frozen=True)
class MoELayout:
    """A MoE architecture merge-moe assembles: what it is made from and how its layers' MoE tensors are named."""

    name: str  # mergekit's (`architecture:` picks one by its start)
    config_class: str
    inputs: tuple[str, ...]  # the model types of the dense models it takes
    shared_experts: int  # how many it takes
    expert: str  # a layer's expert projection: {e}, {part}
    parts: dict[str, str]  # dense projection -> the expert's part
    router: str
    experts_key: str  # the config's expert count
    settings: dict[str, Any]  # set in the config besides the counts (INTERMEDIATE: the base's intermediate size)
    shared_expert: str | None = None  # {part}: the dense projection's name
    shared_router: str | None = None
    attention_biases: tuple[str, ...] = ()  # its attention has these biases: zeros where the base has none
    architecture: str = ""  # (the family's class, filled in by the registry)


@dataclass(frozen=True)
class Family:
    """One model family as unshard knows it. Every part is declared: a value, or Unsupported with the reason."""

    name: str  # as people say it
    model_type: str  # config.json's
    architecture: str  # the transformers class config.json names
    # The state dict written down (names.dense_tables.TensorTable): named with no transformers import; without it
    # transformers is asked once per config (3-4 s, then remembered).
    tensors: Any
    megatron: MegatronRules | Unsupported  # Megatron-LM's legacy and torch_dist checkpoints
    meta_names: dict[str, Any] | Unsupported  # torchtitan's and torchtune's names (names.meta_rules: the rule kinds)
    fused_siblings: tuple[tuple[str, ...], ...] | Unsupported  # --quantize: Linear layers vLLM runs as one
    gguf: GGUFPart | Unsupported
    mmproj: MmprojPart | Unsupported  # the towers' file for llama.cpp (sinks/gguf/vision.py)
    moe_layout: MoELayout | Unsupported  # what merge-moe assembles as this family
    # The names torchtitan's current state-dict adapter gives this family (what `--to dcp --names torchtitan` writes);
    # among meta_names, which also holds older torchtitan's and torchtune's for reading.
    torchtitan_names: dict[str, Any] | Unsupported = NO_TORCHTITAN_NAMES
    # The names torchtune's model gives this family (what `--to dcp --names torchtune` writes), among meta_names;
    # torchtune's last release (0.6.1) has models of Llama, Mistral, Qwen2, Gemma, Gemma 2 and Phi-3/Phi-4 only
    torchtune_names: dict[str, Any] | Unsupported = NO_TORCHTUNE_MODEL
    notes: dict[str, str] = field(default_factory=dict)  # path -> what to know where it says yes
    # --quantize: parameters transformers keeps fused on disk (gpt-oss's experts) that llm-compressor makes Linear
    # layers of before quantizing (linearize_moe): (name, shape, hparams, where) -> a Rearrangement into stacks of one
    # tensor per expert (`<...>.experts.gate_proj.weight`: experts x out x in, each written `<...>.experts.E.gate_proj`)
    linearized: Callable[..., Rearrangement | None] | None = None
    # Where the family's folder keeps the names of its Hub checkpoints, which transformers renames as it loads them
    # (its classes hold other names, and its save_pretrained writes them): why. Its tables name them; transformers is
    # not asked what to name them.
    hub_names: str | None = None
    # Other classes config.json may name for the same model, whose files hold it and a head the paths that need the
    # family's knowledge leave out or keep as it is (BERT's masked-LM head)
    also: tuple[str, ...] = ()
    # Regular expressions over the names transformers' save_pretrained writes and what re.sub makes of them, where it
    # writes other names than the Hub's for some tensors and loads both (Kimi Linear's dense layers): the folder holds
    # the Hub's, which vLLM and llama.cpp's converter read
    hub_renames: tuple[tuple[str, str], ...] = ()

    @property
    def megatron_out(self) -> MegatronRules | Unsupported:
        """What `--to megatron` writes (sinks/megatron.py) of the family's Megatron rules: a dense or MoE model whose
        args say all of it."""
        rules = self.megatron
        if isinstance(rules, Unsupported):
            return rules
        found = rules.signature
        if found is None:
            return Unsupported(f"Megatron-LM's args cannot say this family (they would describe {rules.read_as})")
        return rules


def multimodal_family(
    name: str,
    model_type: str,
    architecture: str,
    gguf: GGUFPart,
    mmproj: MmprojPart | Unsupported,
    tower: str,
    says: str | None = None,
    also: tuple[str, ...] = (),
) -> Family:
    """A vision or speech model unshard knows for GGUF alone: a text model beside a tower (`tower`: what Megatron's
    layout of it would have to map), no trainer's model of it (`says`: its name in those reasons, `name` where None),
    the common fused siblings for --quantize."""
    return gguf_family(name, model_type, architecture, gguf, DEFAULT_FUSED_SIBLINGS, mmproj, also, says, tower)


def gguf_family(
    name: str,
    model_type: str,
    architecture: str,
    gguf: GGUFPart,
    fused_siblings: tuple[tuple[str, ...], ...] | Unsupported,
    mmproj: MmprojPart | Unsupported,
    also: tuple[str, ...] = (),
    says: str | None = None,
    tower: str | None = None,
) -> Family:
    """A family unshard knows for GGUF alone (an encoder's, T5's, a vision or speech model's): its names asked of
    transformers, no trainer's model of it and no Megatron layout (`says`: its name in those reasons, `name` where
    None; `tower`: what Megatron's layout would also have to map), no merge-moe input (`also`: the other classes
    config.json may name for it)."""
    says = says or name
    return Family(
        name,
        model_type,
        architecture,
        tensors=NO_TABLE,
        megatron=Unsupported(f"Megatron's {says} layout{f' ({tower})' if tower else ''} is not mapped yet"),
        **no_trainer_model(says),
        fused_siblings=fused_siblings,
        gguf=gguf,
        mmproj=mmproj,
        moe_layout=NOT_A_MOE_INPUT,
        also=also,
    )
