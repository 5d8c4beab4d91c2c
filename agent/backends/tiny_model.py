"""The embedded default model: a tiny, randomly initialised Qwen3.5, built offline from a config.

    python scripts/make_tiny_qwen35.py OUT_DIR        # or: from agent.backends.tiny_model import build

It is the real architecture (``Qwen3_5ForConditionalGeneration``: hybrid Gated-DeltaNet linear /
full attention, the Qwen3.5 vision tower, M-RoPE), a real byte-level BPE tokenizer with the Qwen
chat special tokens, a Qwen3.5-style chat template (ChatML, image placeholders, ``<think>``
pre-filled in thinking mode) and a ``Qwen3VLProcessor`` — all loadable with ``AutoProcessor`` and
``AutoModelForImageTextToText.from_pretrained(OUT_DIR)``. The weights are random: **its outputs
are meaningless**; it exists so that every code path a GPU user hits runs on a laptop and in CI.
Nothing is downloaded; the build is deterministic for a seed.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

__all__ = ["build", "ensure_tiny_model", "default_tiny_dir", "is_tiny_model", "CHAT_TEMPLATE", "SPECIAL_TOKENS",
           "BUILD_VERSION"]

#: Bump when anything below changes, so cached builds are rebuilt.
BUILD_VERSION = "tiny-qwen35-v3"  # v3: linear-attention head dims 128 (a real engine's kernels serve it)

#: Qwen's chat special tokens (same strings as the real Qwen3.5 tokenizer).
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
    "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
]
#: Added tokens that are *not* special (they survive decoding), as in Qwen's tokenizer.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# A Qwen3.5-style template, written to follow the rendering rules of Qwen3.5's own chat template
# wherever they change what the model sees (ours; the rules, not the text, come from Qwen3.5):
# - ChatML turns; every message's content is trimmed; image parts become
#   <|vision_start|><|image_pad|><|vision_end|>; a system message is allowed first only;
# - the "last query" is the last user message that is not a tool response (its trimmed text is not
#   wrapped in <tool_response>…</tool_response>); rendering fails when there is none;
# - an assistant turn after the last query keeps its reasoning (``reasoning_content``, else the part
#   of its content before </think>) as "<think>\n{reasoning}\n</think>\n\n{content}"; an assistant
#   turn at or before it shows only its visible content;
# - the generation prompt pre-fills "<think>\n" (thinking) or an empty think block (non-thinking).
CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- else -%}{{- raise_exception('Unexpected item type in content.') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set q = namespace(index=-1) -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- set c = render(message['content']) | trim -%}"
    "{%- if not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) -%}"
    "{%- set q.index = loop.index0 -%}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if q.index < 0 -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set content = render(message['content']) | trim -%}"
    "{%- if message['role'] == 'system' -%}"
    "{%- if not loop.first -%}{{- raise_exception('System message must be at the beginning.') -}}{%- endif -%}"
    "{{- '<|im_start|>system\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'user' -%}"
    "{{- '<|im_start|>user\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{%- if message['reasoning_content'] is string -%}"
    "{%- set reasoning = message['reasoning_content'] -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- else -%}{%- set reasoning = '' -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > q.index -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + (reasoning | trim) + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}{{- raise_exception('Unexpected message role.') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}"
    "{{- '<think>\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

# Training text for the BPE merges: enough English and markup that prompts tokenise compactly.
_CORPUS = """
You are a research agent that answers questions by planning and executing focused subtasks.
Think step-by-step, then call one tool per response. <tool_call> {"name": "search", "arguments":
{"query": "who designed the building in the image", "goal": "identify the architect"}} </tool_call>
<tool_response> 1. [Title](https://example.org/page) snippet text about the answer </tool_response>
<answer>the final answer</answer> <subtask> {"description": "identify the object", "prompt": "Use
reverse image search on the image", "assigned_images": ["<image_0>"]} </subtask> lens_search visit
search return message summary source_hint image question step evidence page result results visual
The quick brown fox jumps over the lazy dog. What is the name of the mountain shown in the picture?
Which year was the museum opened, and who is the current director? Based on the provided image,
what is the specific location where this conversation is taking place? 0123456789 2024 2025 2026
""" * 4


def default_tiny_dir() -> Path:
    """Where the embedded model lives: ``$MMCF_TINY_MODEL_DIR``, else ``.cache/tiny-qwen35`` in the source
    checkout the toolkit runs from (the place scripts/demo.sh and scripts/test.sh use: one model whichever
    way a command starts), else (an installed, non-editable copy) ``~/.cache/mmcf-toolkit/tiny-qwen35``."""
    env = os.environ.get("MMCF_TINY_MODEL_DIR")
    if env:
        return Path(env).resolve()
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "agent" / "backends" / "tiny_model.py").is_file():
        return root / ".cache" / "tiny-qwen35"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mmcf-toolkit" / "tiny-qwen35"


def _build_tokenizer(vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, trainers
    from tokenizers.models import BPE
    from transformers.models.qwen3_5.tokenization_qwen3_5 import PRETOKENIZE_REGEX, Qwen3_5Tokenizer

    tok = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator([_CORPUS], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    merges: list = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in model["merges"]]
    hf_tok = Qwen3_5Tokenizer(vocab=model["vocab"], merges=merges)
    from tokenizers import AddedToken

    hf_tok.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[3:]})
    hf_tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS[:3]], special_tokens=True)
    hf_tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    hf_tok.eos_token = "<|im_end|>"
    hf_tok.pad_token = "<|endoftext|>"
    hf_tok.chat_template = CHAT_TEMPLATE
    return hf_tok


def build(out_dir: str | os.PathLike, *, seed: int = 0, bpe_vocab: int = 1024) -> Path:
    """Build the tiny Qwen3.5 into ``out_dir`` (deterministic for ``seed``) and return the path."""
    try:
        import torch
        from transformers import Qwen2VLImageProcessor, Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    except ImportError as e:
        raise ImportError(f"building the tiny model needs the 'local' extra: pip install 'mmcf-toolkit[local]' ({e})") from e

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = _build_tokenizer(bpe_vocab)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + ADDED_TOKENS}
    vocab = len(tok)  # no padded ids: every id decodes to text
    hidden = 64
    cfg = Qwen3_5Config(
        text_config=dict(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            # the real Qwen3.5's linear-attention head dims: vLLM's CPU Gated-DeltaNet kernel takes multiples of 32
            # and then only the sizes it was built for (16 and 32 are refused; chunk_gated_delta_rule_cpu, vLLM 0.32)
            linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_conv_kernel_dim=4, max_position_embeddings=32768,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.5,
                             "mrope_section": [3, 3, 2], "mrope_interleaved": True},
            eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False,
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=hidden,
                           num_position_embeddings=256),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(cfg).eval()
    # Random init with a wider spread than the default so the tiny model's distributions are not
    # uniform (its entropies then vary across tokens, as a real model's do).
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "lm_head" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.generation_config.eos_token_id = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    model.save_pretrained(out)

    # Small images: 16px patches merged 2x2 -> at most (128/32)^2 = 16 image tokens.
    img_proc = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2,
                                     size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128})
    vid_proc = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    proc = Qwen3VLProcessor(image_processor=img_proc, tokenizer=tok, video_processor=vid_proc, chat_template=CHAT_TEMPLATE)
    proc.save_pretrained(out)
    (out / "mmcf_build.json").write_text(json.dumps({
        "build": BUILD_VERSION, "seed": seed, "bpe_vocab": bpe_vocab, "vocab_size": vocab,
        "note": "randomly initialised; outputs are meaningless",
    }, indent=2))
    return out


def ensure_tiny_model(path: str | os.PathLike | None = None, *, seed: int = 0, quiet: bool = False) -> Path:
    """Return the tiny model directory, building it first if it is missing or stale."""
    p = Path(path) if path else default_tiny_dir()
    if _is_current(p / "mmcf_build.json", seed):
        return p
    if not quiet:
        print(f"[mmcf] building the tiny random Qwen3.5 into {p} (offline, a few seconds)…", flush=True)
    tmp = p.with_name(p.name + f".tmp-{os.getpid()}")
    build(tmp, seed=seed)
    if _is_current(p / "mmcf_build.json", seed):  # another process built it meanwhile (parallel test workers)
        shutil.rmtree(tmp)
        return p
    if p.exists():
        shutil.rmtree(p)
    os.replace(tmp, p)
    return p


def is_tiny_model(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` holds a build of the embedded tiny model (its ``mmcf_build.json``), whoever serves it."""
    if path is None:
        return False
    try:
        return str(json.loads((Path(path) / "mmcf_build.json").read_text()).get("build", "")).startswith("tiny-qwen35")
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def _is_current(meta: Path, seed: int) -> bool:
    try:
        info = json.loads(meta.read_text())
    except (OSError, ValueError):
        return False
    return info.get("build") == BUILD_VERSION and info.get("seed") == seed
