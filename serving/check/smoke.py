"""The work of ``python -m serving.check`` once its arguments parse: serving/check/cli.py holds the flags, the
package's docstring says what it does and writes."""
from __future__ import annotations

import asyncio
import json
import math
import shlex
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

from agent.backends import BackendError, ImageError, ModelOutput, SamplingParams, make_backend
from agent.cli import single_endpoint
from agent.http import RetryPolicy
from agent.preflight import PreflightError, model_identity
from analysis.estimators.entropy import grouped_tail_entropy

TOL = 1e-3


def validate(out: ModelOutput, k: int, *, exact_topk: bool) -> list[str]:
    """Problems found in one output (empty list = ok)."""
    problems: list[str] = []
    if not out.tokens:
        problems.append("no tokens came back")
    for i, t in enumerate(out.tokens):
        n = len(t.top)
        if n == 0 or (exact_topk and n != k) or n > k:
            problems.append(f"token {i} ({t.text!r}): {n} alternatives, expected {'' if exact_topk else 'up to '}{k}")
        lps = [a.logprob for a in t.top]
        if any(not math.isfinite(x) or x > TOL for x in lps + [t.logprob]):
            problems.append(f"token {i} ({t.text!r}): non-finite or positive logprob")
            continue
        if any(a < b - 1e-9 for a, b in zip(lps, lps[1:])):
            problems.append(f"token {i} ({t.text!r}): alternatives not sorted best first")
        match = [a for a in t.top if (a.id is not None and a.id == t.id) or (a.id is None and a.text == t.text)]
        if match:
            if abs(match[0].logprob - t.logprob) > TOL:
                problems.append(f"token {i} ({t.text!r}): logprob {t.logprob:.4f} differs from its list entry {match[0].logprob:.4f}")
        elif lps and n == k and t.logprob > lps[-1] + TOL:
            problems.append(f"token {i} ({t.text!r}): not in its top-{k} yet more likely than the k-th")
    for tag in ("<think>", "</think>"):
        if tag in out.text:
            problems.append(f"answer text still contains {tag}: thinking not separated")
    if out.reasoning and not any(t.think for t in out.tokens):
        problems.append("reasoning text came back but no logprob entry is marked as thinking")
    return problems


def report(out: ModelOutput, k: int, problems: list[str]) -> dict:
    H = grouped_tail_entropy(out.top_logprob_matrix(k)) if out.tokens else []
    ex = out.exact_entropy
    return {
        "backend": out.backend, "model": out.model, "logprobs": out.semantics.label(),
        "finish_reason": out.finish_reason,
        "tokens": [{"id": t.id, "text": t.text, "logprob": t.logprob, "think": t.think,
                    "top": [[a.id, a.text, a.logprob] for a in t.top],
                    "entropy_grouped": float(H[i]), "entropy_exact": (float(ex[i]) if ex else None)}
                   for i, t in enumerate(out.tokens)],
        "ok": not problems, "problems": problems,
    }


def default_image() -> Path:
    """A small synthetic test image (so the check needs no file)."""

    p = Path(tempfile.gettempdir()) / "mmcf_check_image.png"
    if not p.exists():
        im = Image.new("RGB", (96, 64), (240, 240, 230))
        d = ImageDraw.Draw(im)
        d.rectangle([8, 8, 40, 56], fill=(200, 30, 30))
        d.ellipse([52, 12, 88, 48], fill=(30, 60, 200))
        im.save(p)
    return p


async def run_check(args) -> dict:
    endpoint = single_endpoint(args)
    kind = args.backend or ("openai" if endpoint else "local")
    if kind in ("openai", "sglang"):
        if not endpoint:
            raise BackendError(f"--backend {kind} needs --endpoint URL")
        policy = RetryPolicy(retries=args.retries, backoff_s=0.5, timeout_s=args.timeout)
        backend = make_backend(kind, endpoint=endpoint, model=args.model, model_dir=args.model_dir,
                               logprob_mode=args.logprob_mode, server=args.server, policy=policy,
                               api_key_env=args.api_key_env)
    elif kind == "scripted":
        backend = make_backend("scripted")
    else:
        backend = make_backend("local", model_dir=args.model_dir, logprob_mode=args.logprob_mode)
    image = Path(args.image) if args.image else default_image()
    messages = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": str(image)}},
        {"type": "text", "text": args.prompt}]}]
    sp = SamplingParams(max_tokens=args.max_tokens, top_logprobs=args.top_logprobs, seed=0)
    try:
        if kind in ("openai", "sglang"):
            # the runner's own model check first (agent/preflight/): the served model, and for SGLang's native
            # path the weights it loaded against --model-dir, so a check never passes where agent.run refuses

            try:
                await model_identity(backend)
            except PreflightError as e:
                raise BackendError(str(e)) from None
        out = await backend.generate(messages, sp)
    finally:
        await backend.aclose()
    exact_topk = not (out.backend.startswith("openai") and out.response and not
                      (out.response.get("choices") or [{}])[0].get("meta_info"))
    return report(out, args.top_logprobs, validate(out, args.top_logprobs, exact_topk=exact_topk))


def next_command(args) -> str:
    """The first run on the backend just checked: the same backend flags, written out (a command that runs)."""

    endpoints = list(getattr(args, "endpoint", None) or [])
    endpoints = endpoints if isinstance(endpoints, list) else [endpoints]
    kind = args.backend or ("openai" if endpoints else "local")
    cmd = ["python", "-m", "agent.run", "--method", "react"]
    if kind != "local" or args.model_dir:
        cmd += ["--backend", kind]
    for e in endpoints:
        cmd += ["--endpoint", e]
    defaults = {"--logprob-mode": "scaled", "--server": "sglang"}  # agent.run's: not repeated
    for flag, value in (("--model", getattr(args, "model", None)), ("--model-dir", args.model_dir),
                        ("--logprob-mode", args.logprob_mode), ("--server", getattr(args, "server", None)),
                        ("--api-key-env", getattr(args, "api_key_env", None))):
        if value and value != defaults.get(flag):
            cmd += [flag, str(value)]
    if kind == "local" and not args.model_dir:
        cmd += ["--limit", "2"]  # the embedded tiny model: a small first run
    return shlex.join([*cmd, "--out", "runs/first-run"])


def check_command(args) -> int:
    """``python -m serving.check`` once its arguments parse."""
    try:
        rep = asyncio.run(run_check(args))
    except (BackendError, ImageError) as e:
        rep = {"backend": None, "tokens": [], "ok": False, "problems": [str(e)]}
    if args.json:
        print(json.dumps(rep, ensure_ascii=False))
    else:
        if rep.get("model"):
            print(f"backend {rep['backend']}  model {rep['model']}  logprobs {rep.get('logprobs')}")
        for t in rep["tokens"]:
            top = ", ".join(f"{a[1]!r}:{a[2]:.2f}" for a in t["top"][:5])
            ex = f" exact={t['entropy_exact']:.3f}" if t["entropy_exact"] is not None else ""
            print(f"{'T' if t['think'] else ' '} {t['text']!r:>14} lp={t['logprob']:.3f} H_grouped={t['entropy_grouped']:.3f}{ex}  top: {top} …")
        print("OK" if rep["ok"] else "FAILED:\n  " + "\n  ".join(rep["problems"]))
        if rep["ok"]:
            print("next: " + next_command(args))
    return 0 if rep["ok"] else 1


