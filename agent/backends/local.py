"""In-process transformers backend: any local image-text-to-text model directory (Qwen3.5 first).

    backend = LocalBackend("path/to/model", logprob_mode="scaled")   # SGLang's default semantics
    out = await backend.generate(messages, SamplingParams())
    sc  = await backend.score(messages, Continuation(ids=[t.id for t in out.tokens]))

Generation samples with temperature and top-p like SGLang, recording for every token its top-k
alternatives of either the *raw* (log_softmax(logits)) or the *scaled* (log_softmax(logits / T))
distribution — and the **exact full-vocabulary entropy** of that same distribution, so the grouped
top-20 estimate can be compared with the truth. Scoring is teacher-forced on the whole sequence
with the vocabulary projection applied in chunks of positions (memory O(chunk × vocab), never
O(sequence × vocab)). Needs the ``local`` extra (torch, torchvision, transformers >= 5.2).
"""
from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import os
import re
import threading
import time

from .base import (
    DEFAULT_TOP_LOGPROBS,
    BackendError,
    Continuation,
    LogprobSemantics,
    ModelOutput,
    SamplingParams,
    ScoredTokens,
    TokenArrays,
    Usage,
)
from .hub import resolve_model_dir
from .messages import record_messages, split_text_and_images
from .think import THINK_OPEN, mark_think, split_think

__all__ = ["LocalBackend", "load_chat_renderer"]


def _import_torch():
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        raise BackendError(f"the local backend needs the 'local' extra: pip install 'mmcf-toolkit[local]' ({e})") from e
    return torch


#: What a parent process learnt about each model directory's tokenizer: the class ``AutoTokenizer`` chose and a
#: fingerprint of what it renders. A ``--processes`` worker gets these, imports that class directly and checks the
#: fingerprint: ``AutoTokenizer`` itself imports torch through transformers' configuration code (a large part of a
#: worker's start on a 2-core machine), the class alone does not.
_RENDERER_HINTS: dict[str, dict] = {}


def renderer_hints() -> dict[str, dict]:
    """The hints of this process (see ``_RENDERER_HINTS``), to hand to a worker process."""
    return {k: dict(v) for k, v in _RENDERER_HINTS.items()}


def set_renderer_hints(hints: dict[str, dict] | None) -> None:
    _RENDERER_HINTS.update(hints or {})


def _fingerprint(tok) -> str:
    """What the tokenizer does with a fixed conversation: its class, vocabulary size, chat template, a rendered
    prompt (thinking on and off) and the ids of that prompt."""

    conv = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is shown? <image_1>"},
            {"role": "assistant", "content": "a", "reasoning_content": "r"}, {"role": "user", "content": "ok"}]
    h = hashlib.sha256(f"{type(tok).__module__}:{type(tok).__qualname__}:{len(tok)}".encode())
    h.update(str(getattr(tok, "chat_template", "")).encode())
    for kw in ({}, {"enable_thinking": False}):
        try:
            text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True, **kw)
        except Exception as e:  # noqa: BLE001 - a template that refuses this conversation: that is its fingerprint
            text = f"<{type(e).__name__}>"
        h.update(str(text).encode())
        h.update(repr(tok(str(text), add_special_tokens=False)["input_ids"]).encode())
    return h.hexdigest()


def _from_hint(path, hint: dict):
    """The tokenizer loaded with the class a parent process found, or None when that fails or differs."""

    try:
        mod, _, name = str(hint["class"]).partition(":")
        cls = getattr(importlib.import_module(mod), name)
        tok = cls.from_pretrained(path, _from_auto=True)  # what AutoTokenizer passes on
        if not getattr(tok, "chat_template", None) and (path / "chat_template.jinja").exists():
            tok.chat_template = (path / "chat_template.jinja").read_text()
        return tok if _fingerprint(tok) == hint["fingerprint"] else None
    except Exception:  # noqa: BLE001 - anything at all: load it the ordinary way
        return None


def _named_tokenizer(path):
    """The tokenizer class ``tokenizer_config.json`` names (``Qwen3_5Tokenizer`` ->
    ``transformers.models.qwen3_5.tokenization_qwen3_5``), loaded without AutoTokenizer, or None.

    Ours, for memory: AutoTokenizer imports transformers' configuration machinery, which imports torch (its RSS
    and start-up in every HTTP-path probe and runner process that only renders prompts); the class itself
    does not. AutoTokenizer resolves the same name to the same class; anything unusual (no name, a class
    outside transformers.models, an import error) falls back to it."""

    try:
        name = json.loads((path / "tokenizer_config.json").read_text()).get("tokenizer_class")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Z][A-Za-z0-9_]*Tokenizer(Fast)?", name):
            return None
        stem = name.removesuffix("Fast").removesuffix("Tokenizer")
        mod = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem).lower()  # Qwen3_5 -> qwen3_5, XLMRoberta -> xlmroberta
        module = importlib.import_module(f"transformers.models.{mod}.tokenization_{mod}")
        cls = getattr(module, name, None) or getattr(module, name.removesuffix("Fast"))
        return cls.from_pretrained(path, _from_auto=True)  # what AutoTokenizer passes on
    except Exception:  # noqa: BLE001 - anything at all: AutoTokenizer decides
        return None


def load_chat_renderer(model_dir: str | os.PathLike):
    """The tokenizer of a model directory with its chat template loaded (no torch needed, none imported)."""

    path = resolve_model_dir(model_dir)
    hint = _RENDERER_HINTS.get(str(path))
    tok = _from_hint(path, hint) if hint else None
    if tok is not None:
        return tok
    tok = _named_tokenizer(path)
    if tok is None:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise BackendError(f"rendering prompts needs transformers: pip install 'transformers>=5.2' ({e})") from e
        try:
            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as e:
            raise BackendError(f"{path}: cannot load a tokenizer ({e})") from e
    if not getattr(tok, "chat_template", None):
        jinja = path / "chat_template.jinja"
        if jinja.exists():
            tok.chat_template = jinja.read_text()
        else:
            raise BackendError(f"{path}: no chat template (chat_template.jinja or tokenizer_config.json)")
    # what a worker process needs to load the same tokenizer without AutoTokenizer (renewed: the files may change)
    _RENDERER_HINTS[str(path)] = {"class": f"{type(tok).__module__}:{type(tok).__qualname__}",
                                  "fingerprint": _fingerprint(tok)}
    return tok


class _TokenCodec:
    """Per-id decoding with a cache (the top-20 of every token needs 20 decodes)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self._cache: dict[int, str] = {}

    def text(self, i: int) -> str:
        s = self._cache.get(i)
        if s is None:
            s = self.tok.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False)
            self._cache[i] = s
        return s


class LocalBackend:
    """Runs a transformers model in this process (CPU or one GPU)."""

    name = "local"

    def __init__(self, model_dir: str | os.PathLike, *, logprob_mode: str = "scaled", device: str | None = None,
                 score_chunk: int = 256, seed: int = 0, dtype: str | None = None):
        if logprob_mode not in ("raw", "scaled"):
            raise ValueError(f"logprob_mode must be 'raw' or 'scaled', got {logprob_mode!r}")
        torch = _import_torch()

        path = resolve_model_dir(model_dir)
        if not (path / "config.json").exists():
            raise BackendError(f"{path}: model directory not found (expected a config.json there)")
        from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

        try:
            self.processor = AutoProcessor.from_pretrained(path)
            kw = {"dtype": getattr(torch, dtype)} if dtype else {}
            self.hf_model = AutoModelForImageTextToText.from_pretrained(path, **kw).eval()
        except (OSError, ValueError) as e:
            raise BackendError(f"{path}: cannot load model/processor ({e})") from e
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.hf_model.to(self.device)
        if self.device == "cpu":  # the fused CUDA kernels it suggests installing (causal_conv1d, fla) cannot run here
            logging.getLogger("transformers.integrations.hub_kernels").setLevel(logging.ERROR)
        self.tokenizer = self.processor.tokenizer
        self.codec = _TokenCodec(self.tokenizer)
        eos = self.hf_model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        im_end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(im_end, int) and im_end not in eos:
            eos.append(im_end)
        self.eos_ids = eos
        # A clean generation config: the model directory's own sampling defaults (do_sample, top_k…)
        # must not add logits warpers in front of ours, or the recorded distribution would be theirs.
        self.hf_model.generation_config = GenerationConfig(eos_token_id=eos, pad_token_id=self.tokenizer.pad_token_id)
        self.model = path.name
        self.model_dir = path
        self.logprob_mode = logprob_mode
        self.score_chunk = int(score_chunk)
        self.seed = seed
        self._lock = threading.Lock()
        self._stop = threading.Event()  # the running call's cancellation (set by _in_thread)
        self._calls = 0

    # ---------------------------------------------------------------- prompt encoding
    def _encode(self, messages: list[dict], enable_thinking: bool | None, extra_kwargs: dict | None = None):
        hf_msgs, images = split_text_and_images(messages, fetch_urls=True)
        kw = dict(extra_kwargs or {})
        if enable_thinking is not None:
            kw["enable_thinking"] = enable_thinking
        text = self.processor.apply_chat_template(hf_msgs, add_generation_prompt=True, tokenize=False, **kw)
        self._check_placeholders(text, len(images))
        pil = [im.pil() for im in images]
        inputs = self.processor(text=[text], images=pil or None, return_tensors="pt")
        return text, inputs.to(self.device), images

    def _check_placeholders(self, text: str, n_images: int) -> None:
        """Refuse a prompt whose text holds image or video placeholders that no image backs (a reply or a page
        that wrote ``<|image_pad|>``): the processor and the model's position code cannot place them (transformers
        fails with StopIteration or TypeError). The chat template writes one ``<|image_pad|>`` per image."""
        image_tok = getattr(self.processor, "image_token", None)
        video_tok = getattr(self.processor, "video_token", None)
        extra = {tok: text.count(tok) - want for tok, want in ((image_tok, n_images), (video_tok, 0)) if tok}
        extra = {tok: n for tok, n in extra.items() if n > 0}
        if extra:
            found = ", ".join(f"{n} {tok}" for tok, n in extra.items())
            raise BackendError(f"the prompt's text holds {found} placeholder(s) beyond its {n_images} image(s) "
                               f"(written by a reply or a tool result): the model cannot place them; refused")

    def _starts_in_think(self, prompt_text: str) -> bool:
        tail = prompt_text.rstrip()
        return tail.endswith(THINK_OPEN)

    # ---------------------------------------------------------------- generation
    def _generate_sync(self, messages: list[dict], sp: SamplingParams) -> ModelOutput:
        torch = _import_torch()
        from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        if (sp.top_k not in (-1, 0)) or sp.min_p or sp.repetition_penalty != 1.0:
            raise BackendError("the local backend samples with temperature and top-p only: top_k must be -1, "
                               "min_p 0 and repetition_penalty 1")
        t0 = time.perf_counter()
        prompt_text, inputs, images = self._encode(messages, sp.enable_thinking, sp.chat_template_kwargs)
        k = int(sp.top_logprobs)
        sem = LogprobSemantics.for_generation(self.logprob_mode, sp.temperature)
        gen = torch.Generator(device="cpu").manual_seed(sp.seed if sp.seed is not None else self.seed + self._calls)
        self._calls += 1
        rec: list[tuple[int, float, list[int], list[float], float]] = []
        T, top_p = float(sp.temperature), float(sp.top_p)

        class Recorder(LogitsProcessor):
            def __call__(self, input_ids, scores):
                logits = scores[0].float()
                raw = torch.log_softmax(logits, dim=-1)
                scaled = torch.log_softmax(logits / T, dim=-1) if T > 0 else raw
                rep = raw if sem.kind == "raw" else scaled
                p = rep.exp()
                exact = float(-(torch.where(p > 0, p * rep, torch.zeros_like(p))).sum())
                tv, ti = torch.topk(rep, min(k, rep.numel()))
                if T <= 0:
                    choice = int(torch.argmax(logits))
                else:
                    probs = scaled.exp()
                    if top_p < 1.0:
                        sp_, si = torch.sort(probs, descending=True)
                        keep = (torch.cumsum(sp_, 0) - sp_) < top_p
                        filt = torch.zeros_like(probs)
                        filt[si[keep]] = sp_[keep]
                        probs = filt / filt.sum()
                    choice = int(torch.multinomial(probs.cpu(), 1, generator=gen))
                rec.append((choice, float(rep[choice]), ti.tolist(), tv.tolist(), exact))
                out = torch.full_like(scores, float("-inf"))
                out[0, choice] = 0.0
                return out

        stops = [s for s in (sp.stop or []) if s]
        codec = self.codec

        cancelled = self._stop

        class StopOnStrings(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                if cancelled.is_set():  # the caller was cancelled: end here (the reply is never used)
                    return torch.ones(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
                if not stops or not rec:
                    return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
                tail = "".join(codec.text(r[0]) for r in rec[-16:])
                hit = any(s in tail for s in stops)
                return torch.full((input_ids.shape[0],), hit, dtype=torch.bool, device=input_ids.device)

        with torch.no_grad():
            self.hf_model.generate(
                **inputs, do_sample=False, max_new_tokens=int(sp.max_tokens),
                logits_processor=LogitsProcessorList([Recorder()]),
                stopping_criteria=StoppingCriteriaList([StopOnStrings()]),
                eos_token_id=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id,
            )
        return self._output(rec, messages, sp, sem, prompt_text, inputs, images, stops, t0)

    def _output(self, rec: list, messages, sp: SamplingParams, sem, prompt_text: str, inputs, images, stops,
                t0: float) -> ModelOutput:
        """The generated tokens (``rec``: id, logprob, top ids, top logprobs, exact entropy) as a ModelOutput."""
        ids = [r[0] for r in rec]
        k = max((len(r[2]) for r in rec), default=0)
        tokens = TokenArrays(ids, [self.codec.text(c) for c in ids], [r[1] for r in rec],
                             [list(r[2]) + [-1] * (k - len(r[2])) for r in rec],
                             [list(r[3]) + [float("nan")] * (k - len(r[3])) for r in rec],
                             counts=[len(r[2]) for r in rec], decode=self.codec.text)
        finish = "length"
        if ids and ids[-1] in self.eos_ids:
            finish = "stop"
        text_ids = ids[:-1] if finish == "stop" else ids
        raw_text = self.tokenizer.decode(text_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if stops and finish == "length" and any(s in raw_text for s in stops):
            finish = "stop"
        starts = self._starts_in_think(prompt_text)
        mark_think(tokens, starts)
        reasoning, answer = split_think(raw_text, starts)
        n_think = int(tokens.think.sum())
        prompt_len = int(inputs["input_ids"].shape[1])
        return ModelOutput(
            text=answer, reasoning=reasoning, tokens=tokens, finish_reason=finish,
            usage=Usage(prompt_tokens=prompt_len, completion_tokens=len(tokens), cached_tokens=0, reasoning_tokens=n_think),
            semantics=sem, backend=self.name, model=self.model, latency_s=time.perf_counter() - t0,
            request={"messages": record_messages(messages), "sampling": sp.to_dict(), "prompt_text": prompt_text,
                     "image_sha256": [im.sha256 for im in images]},
            response={"output_ids": ids, "raw_text": raw_text}, exact_entropy=[r[4] for r in rec], top_k_requested=int(sp.top_logprobs),
        )

    async def generate(self, messages: list[dict], sampling: SamplingParams | None = None) -> ModelOutput:
        sp = sampling or SamplingParams()
        return await self._in_thread(self._generate_sync, messages, sp)

    async def _in_thread(self, fn, *a):
        """``fn(*a)`` on a worker thread, one model call at a time. A call cancelled (Ctrl-C, SIGTERM) never starts
        its work if it has not, and a generation under way ends at its next token: a stopped run exits at once,
        not after the model calls queued behind the lock (the interpreter waits for its worker threads)."""
        stop = threading.Event()
        try:
            return await asyncio.to_thread(self._locked, stop, fn, *a)
        except asyncio.CancelledError:
            stop.set()
            raise

    def _locked(self, stop: threading.Event, fn, *a):
        with self._lock:
            if stop.is_set():
                raise BackendError("the call was cancelled before it started")
            self._stop = stop
            return fn(*a)

    # ---------------------------------------------------------------- teacher-forced scoring
    def _score_sync(self, messages: list[dict], cont: Continuation, k: int, enable_thinking: bool | None,
                    temperature: float | None) -> ScoredTokens:
        torch = _import_torch()
        prompt_text, inputs, images = self._encode(messages, enable_thinking)
        ids = list(cont.ids) if cont.ids else self.tokenizer(cont.text, add_special_tokens=False)["input_ids"]
        if not ids:
            raise BackendError("empty continuation: nothing to score")
        P = int(inputs["input_ids"].shape[1])
        c = torch.tensor([ids], dtype=inputs["input_ids"].dtype, device=self.device)
        full = dict(inputs)
        full["input_ids"] = torch.cat([inputs["input_ids"], c], dim=1)
        full["attention_mask"] = torch.ones_like(full["input_ids"])
        if "mm_token_type_ids" in inputs:
            full["mm_token_type_ids"] = torch.cat([inputs["mm_token_type_ids"], torch.zeros_like(c)], dim=1)
        sem = LogprobSemantics("raw") if not temperature else LogprobSemantics("scaled", float(temperature))
        with torch.no_grad():
            base = self.hf_model.model(**full, use_cache=False)
            hidden = base.last_hidden_state[0, P - 1: P - 1 + len(ids)]
            lm_head = self.hf_model.get_output_embeddings()
            chosen_lps, top_ids, top_lps, exact = [], [], [], []
            for s in range(0, len(ids), self.score_chunk):
                logits = lm_head(hidden[s: s + self.score_chunk]).float()
                if temperature:
                    logits = logits / float(temperature)
                lp = torch.log_softmax(logits, dim=-1)
                p = lp.exp()
                ent = -(torch.where(p > 0, p * lp, torch.zeros_like(p))).sum(-1)
                tv, ti = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
                tgt = torch.tensor(ids[s: s + self.score_chunk], device=lp.device)
                chosen_lps += lp.gather(1, tgt[:, None])[:, 0].tolist()
                top_ids += ti.tolist()
                top_lps += tv.tolist()
                exact.extend(ent.tolist())
                del logits, lp, p
        tokens = TokenArrays(ids, [self.codec.text(t) for t in ids], chosen_lps, top_ids, top_lps,
                             decode=self.codec.text)
        mark_think(tokens, self._starts_in_think(prompt_text))
        return ScoredTokens(tokens=tokens, semantics=sem, backend=self.name, model=self.model, exact_entropy=exact,
                            request={"messages": record_messages(messages), "continuation_ids": ids,
                                     "image_sha256": [im.sha256 for im in images]},
                            top_k_requested=k)

    async def score(self, messages: list[dict], continuation: Continuation, *, top_logprobs: int = DEFAULT_TOP_LOGPROBS,
                    enable_thinking: bool | None = True, temperature: float | None = None) -> ScoredTokens:
        """Teacher-forced logprobs (raw; or of log_softmax(logits/T) when ``temperature`` is given)."""
        return await self._in_thread(self._score_sync, messages, continuation, int(top_logprobs), enable_thinking,
                                     temperature)

    async def aclose(self) -> None:
        return None
