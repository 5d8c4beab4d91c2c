"""The stand-in scheduler's engines: what produces each token of a request. The scripted engine plants texts and
distributions; the model engine runs the embedded tiny Qwen3.5 in process (real logits, real top-k).
"""
from __future__ import annotations

import importlib
import os
import time


def eos_ids(tok) -> list[int]:
    out = []
    for t in ("<|im_end|>", "<|endoftext|>"):
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and i >= 0 and i != tok.unk_token_id:
            out.append(i)
    return out


# ====================================================================== engines
class _Gen:
    def __init__(self, steps, input_logprobs=None):
        self._steps = iter(steps)
        self.input_logprobs = input_logprobs

    def next_token(self):
        return next(self._steps)


class ScriptedEngine:
    """Planted texts with planted distributions: the reply's tokens, each the top choice with logprob about -0.1
    and k-1 alternatives well below it (one distribution: the k probabilities sum to less than 1); scoring
    (max_new_tokens 0) gives each input token its entry in the same planted list (the top one), as a real server's
    scored token is its own entry in its top list."""

    def __init__(self, tok):
        self.tok = tok

    def _top(self, tid, k, j):
        vals = [-0.1 - 0.01 * (j % 7)] + [-3.5 - 0.3 * a - 0.01 * (j % 7) for a in range(1, k)]
        ids = [tid] + [(tid + 7 * a) % 600 + 1 for a in range(1, k)]
        return vals, ids

    def _policy(self):
        spec = os.environ.get("MMCF_STANDIN_POLICY")
        if not spec:
            return None

        mod, _, fn = spec.partition(":")
        return getattr(importlib.import_module(mod), fn)

    def start(self, ids, mm, sp, k, *, want_input, input_from, original_logprobs=False):
        policy = self._policy()
        if policy is not None:  # the reply depends on the prompt (e.g. serving/fakes/policy.py's agent policy)
            prompt = self.tok.decode(ids, skip_special_tokens=False)
            reply = policy({"messages": prompt, "text": prompt})
        else:
            reply = os.environ.get("MMCF_STANDIN_REPLY", DEFAULT_REPLY)
        eos = eos_ids(self.tok)
        out = self.tok(reply, add_special_tokens=False)["input_ids"] + eos[:1]
        steps = []
        for j, t in enumerate(out):
            v, i = self._top(t, k, j)
            steps.append((t, v[0] if k else -0.1, v if k else [], i if k else []))
        inp = None
        if want_input:  # SGLang's layout: [None] first (the token at logprob_start_len), then one per token
            sl = ids[input_from:]
            iv = [None] + [-0.1 - 0.01 * (j % 7) for j in range(1, len(sl))]
            tops = [self._top(t, k, j) for j, t in enumerate(sl)]
            inp = (iv, list(sl), [None] + [t[0] for t in tops[1:]] if k else [],
                   [None] + [t[1] for t in tops[1:]] if k else [])
        return _Gen(steps, inp)


class ModelEngine:
    """The embedded tiny Qwen3.5 in transformers: one forward over the prompt (with the request's pixel values
    and image_grid_thw), then one token at a time with a KV cache; logprobs as SGLang reports them."""

    def __init__(self, model_path: str):
        import torch
        from transformers import AutoModelForImageTextToText

        if not os.environ.get("OMP_NUM_THREADS"):  # ours: two threads at most for a tiny model; the variable wins
            torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        self.torch = torch
        self.model = AutoModelForImageTextToText.from_pretrained(model_path, dtype=torch.float32).eval()
        self.image_token_id = int(getattr(self.model.config, "image_token_id", -1))

    def _mm(self, mm, ids):
        """The forward's multimodal inputs: the items' pixel values and grids, the image positions (SGLang's
        ``offsets``, inclusive) marked with the model's image token and in ``mm_token_type_ids``."""
        import torch

        if mm is None or not getattr(mm, "mm_items", None):
            return {}
        for it in mm.mm_items:
            for a, b in it.offsets or ():
                ids[0, a:b + 1] = self.image_token_id
        pix, grids = [], []
        for it in mm.mm_items:
            f = it.feature
            # the TokenizerManager hands large features over in shared memory (ShmPointerMMData), as the real
            # scheduler's request receiver unwraps them
            if hasattr(f, "materialize"):
                f = f.materialize()
            elif isinstance(f, (list, tuple)):
                f = torch.cat([torch.as_tensor(x.materialize() if hasattr(x, "materialize") else x) for x in f], 0)
            pix.append(torch.as_tensor(f))
            g = (it.model_specific_data or {}).get("image_grid_thw")
            if g is not None:
                grids.append(torch.as_tensor(g).reshape(-1, 3))
        out = {"pixel_values": torch.cat(pix, 0).to(torch.float32),
               "mm_token_type_ids": (ids == self.image_token_id).long()}
        if grids:
            out["image_grid_thw"] = torch.cat(grids, 0)
        return out

    def start(self, ids, mm, sp, k, *, want_input, input_from, original_logprobs=False):
        torch = self.torch
        x = torch.tensor([ids])
        mm_kw = self._mm(mm, x)
        with torch.no_grad():
            out = self.model(input_ids=x, use_cache=True, **mm_kw)
        logits = out.logits[0].float()
        inp = None
        if want_input:
            lps = torch.log_softmax(logits, -1)
            iv, tv, ti = [], [], []
            for pos in range(input_from, len(ids)):
                if pos == input_from:  # SGLang's layout: the token at logprob_start_len has no logprob
                    iv.append(None)
                    tv.append(None)
                    ti.append(None)
                    continue
                row = lps[pos - 1]
                iv.append(float(row[ids[pos]]))
                if k:
                    v, i = torch.topk(row, k)
                    tv.append(v.tolist())
                    ti.append(i.tolist())
            inp = (iv, list(ids[input_from:]), tv if k else [], ti if k else [])
        past = out.past_key_values
        last = logits[-1]
        temp = float(sp.temperature or 0.0)
        top_p, top_k = float(sp.top_p or 1.0), int(sp.top_k or -1)
        gen = torch.Generator().manual_seed(int(sp.sampling_seed) if getattr(sp, "sampling_seed", None) is not None
                                           else int(time.time_ns() % (2**31)))
        model = self.model
        n_prompt = len(ids)

        def steps():
            nonlocal last, past
            pos = n_prompt
            while True:
                raw = torch.log_softmax(last, -1)
                scaled = torch.log_softmax(last / temp, -1) if temp > 0 else raw
                probs = scaled.exp()
                if top_k > 0:
                    kth = torch.topk(probs, min(top_k, probs.numel())).values[-1]
                    probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
                if top_p < 1.0:
                    sv, si = torch.sort(probs, descending=True)
                    keep = torch.cumsum(sv, 0) - sv < top_p * sv.sum()
                    mask = torch.zeros_like(probs, dtype=torch.bool)
                    mask[si[keep]] = True
                    probs = torch.where(mask, probs, torch.zeros_like(probs))
                tid = int(torch.multinomial(probs / probs.sum(), 1, generator=gen)) if temp > 0 else int(torch.argmax(last))
                # SGLang's sampler (srt/layers/sampler.py): log_softmax(logits / T) by default, log_softmax(logits)
                # under SGLANG_RETURN_ORIGINAL_LOGPROB or greedy sampling
                src = raw if original_logprobs else scaled
                if k:
                    v, i = torch.topk(src, k)
                    tv, ti = v.tolist(), i.tolist()
                else:
                    tv, ti = [], []
                yield tid, float(src[tid]), tv, ti
                with torch.no_grad():
                    o = model(input_ids=torch.tensor([[tid]]), past_key_values=past, use_cache=True,
                              cache_position=torch.tensor([pos]))
                past, last = o.past_key_values, o.logits[0, -1].float()
                pos += 1

        return _Gen(steps(), inp)


#: The reply of ``--mode scripted`` when none is given.
DEFAULT_REPLY = "Let me look at the picture.</think>\n\nIt shows a red square."
