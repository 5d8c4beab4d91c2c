"""ReAct-Adaptive: unload the query images once the model's thinking no longer depends on them (ours).

    python -m agent.run --method react --image-unload adaptive [--unload-signal kl|dH]
                        [--unload-threshold EPS | CALIBRATION.json] [--unload-patience M] ...

The paper ends (§5) with "adaptive mechanisms that detect when visual grounding is complete" as future
work, after showing that no fixed removal step k suits every task (§4.3, Table 3, Figure 2(c)). This is one
such mechanism, built from the paper's own probe (§3.2.2, B.4) run online:

- at each ReAct step t whose context still holds the query images, the step is generated as usual; then its
  tokens are scored teacher-forced **without** the query images (the Removal@k projection: image parts
  dropped, ``<image_k>`` identifiers and retrieved images kept), and — unless the generation's own logprobs
  are raw — once more with them, so both sides are raw logprobs as in the entropy probe;
- the step's influence is the mean over its think tokens of KL(with ‖ without) (``--unload-signal kl``,
  the default) or of how much the images lower the think entropy, max(0, −ΔH_t) (``dH``);
- once the influence has stayed below ε for M consecutive steps (the detection step t), the images are
  removed from step t+1 on, exactly as ``--remove-images-from-step t+1`` would remove them.

With patience M the earliest possible unloading after a grounding phase of g steps is g+M+1: an online
detector sees a step's influence only after that step was generated with the images. Steps whose output
ends the episode (an answer, the forced last call) are not probed. The probe calls go through the same
backend, are recorded as ``unload_probe`` events (influence, decision, streak, latency, scoring calls) and
as per-token columns ``unload_kl`` / ``unload_dH`` in the token sidecar, and do not count toward T_max;
the line's ``image_unload`` summarises them (detection and unload step, probes, scoring calls, seconds).

Only backends that can score a fixed continuation can do this: ``local`` (in-process), ``sglang``
(native /generate) and the ``scripted`` fake. The chat API (``openai``) cannot; the runner refuses it
before any work.

Defaults for ε and M: :data:`DEFAULT_THRESHOLD` and :data:`DEFAULT_PATIENCE` are ours and *uncalibrated*
(no real model could be run where this was written); ``python -m probes.calibrate_unload RUN_DIR`` picks
them for a model from a ReAct run's teacher-forced influences and its step-k removal replays, and
``--unload-threshold path/to/calibration.json`` uses its choice. The header records where ε came from.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from analysis.estimators.influence import token_influence

from ..backends.base import BackendError, Continuation
from ..backends.messages import strip_query_images
from ..choices import DEFAULT_PATIENCE, DEFAULT_THRESHOLD
from ..choices import UNLOAD_SIGNALS as SIGNALS
from ..trajectory import EventView

__all__ = ["UnloadPolicy", "UnloadTracker", "SIGNALS", "SCORING_BACKENDS", "DEFAULT_THRESHOLD", "DEFAULT_PATIENCE",
           "influence_of"]

#: Backends that can score a fixed continuation under another context (teacher forcing).
SCORING_BACKENDS = ("local", "sglang", "scripted")


def influence_of(signal: str, kl_mean: float, dH_mean: float) -> float:
    """The step's influence under ``signal``: mean KL, or how much the images lower the entropy (≥ 0)."""
    if signal == "kl":
        return kl_mean
    if signal == "dH":
        return float("nan") if not np.isfinite(dH_mean) else max(0.0, -dH_mean)
    raise ValueError(f"unload signal must be one of {SIGNALS}, got {signal!r}")


@dataclass(frozen=True)
class UnloadPolicy:
    signal: str = "kl"
    threshold: float = DEFAULT_THRESHOLD["kl"]
    patience: int = DEFAULT_PATIENCE
    source: str = "default (ours; not calibrated for this model)"

    def __post_init__(self):
        if self.signal not in SIGNALS:
            raise ValueError(f"--unload-signal must be one of {SIGNALS}, got {self.signal!r}")
        if not (np.isfinite(self.threshold) and self.threshold >= 0):
            raise ValueError(f"--unload-threshold must be a number >= 0, got {self.threshold!r}")
        if self.patience < 1:
            raise ValueError(f"--unload-patience must be >= 1, got {self.patience}")

    @property
    def label(self) -> str:
        return f"adaptive-{self.signal}<{self.threshold:g}-m{self.patience}"

    def to_dict(self) -> dict:
        return {"policy": "adaptive", "signal": self.signal, "threshold": self.threshold, "patience": self.patience,
                "threshold_source": self.source}

    @classmethod
    def from_args(cls, signal: str | None = None, threshold: str | float | None = None,
                  patience: int | None = None) -> "UnloadPolicy":
        """``threshold``: a number, a ``calibration.json`` of :mod:`probes.calibrate_unload`, or None (default).

        A calibration file also gives the signal and patience unless they are given explicitly; its signal
        must match ``signal`` when both are given."""
        m = DEFAULT_PATIENCE if patience is None else int(patience)
        if threshold is None or threshold == "":
            signal = signal or "kl"
            return cls(signal, DEFAULT_THRESHOLD.get(signal, 0.0), m)
        try:
            eps = float(threshold)
        except ValueError:
            eps = None
        if eps is not None:
            return cls(signal or "kl", eps, m, "given (--unload-threshold)")
        if not Path(str(threshold)).is_file():
            raise ValueError(f"--unload-threshold {threshold!r}: neither a number nor a calibration.json "
                             "(python -m probes.calibrate_unload RUN_DIR writes one)")
        p = Path(str(threshold))
        try:
            cal = json.loads(p.read_text())
            chosen = cal["chosen"]
            eps, m_cal, sig = float(chosen["threshold"]), int(chosen["patience"]), cal["signal"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{p}: not a calibration file of python -m probes.calibrate_unload ({e})") from None
        if signal and sig != signal:
            raise ValueError(f"{p} calibrates --unload-signal {sig}, not {signal}")
        digest = hashlib.sha256(p.read_bytes()).hexdigest()[:12]
        return cls(sig, eps, m_cal if patience is None else int(patience),
                   f"calibrated: {p} (sha256 {digest}; model {cal.get('model', {}).get('served_model')}, "
                   f"run {cal.get('run_dir')})")


@dataclass
class UnloadTracker:
    """One trajectory's detector: probes each image-bearing step, counts the streak, decides when to unload."""

    policy: UnloadPolicy
    streak: int = 0
    detect_step: int | None = None
    unload_step: int | None = None     # the first step without the query images
    probes: int = 0
    scoring_calls: int = 0
    scored_tokens: int = 0
    seconds: float = 0.0
    influences: list = field(default_factory=list)

    def images_at(self, step: int) -> bool:
        return self.unload_step is None or step < self.unload_step

    async def observe(self, ep, ev: EventView, messages: list[dict], out) -> EventView:
        """Probe step ``ev`` (generated from ``messages`` with the query images); record it; maybe unload."""

        t0 = time.monotonic()
        step = ev["index"]
        think = out.think_mask()
        ids = [t.id for t in out.tokens]
        cont = Continuation(ids=ids if ids and None not in ids else None,
                            text="".join(t.text for t in out.tokens) or None)
        if cont.ids is None and not cont.text:
            raise BackendError(f"step {step}: nothing to score (the step generated no tokens)")
        sp = ep.sampling
        calls = 0
        if out.semantics.label() == "raw":  # the generation's own logprobs are the with-images side
            with_tokens = out.tokens
        else:
            sc = await ep.backend.score(messages, cont, top_logprobs=20, enable_thinking=sp.enable_thinking)
            with_tokens, calls = sc.tokens, calls + 1
        without = strip_query_images(messages)
        sc2 = await ep.backend.score(without, cont, top_logprobs=20, enable_thinking=sp.enable_thinking)
        calls += 1
        for side, toks in (("with", with_tokens), ("without", sc2.tokens)):
            if len(toks) != len(out.tokens):
                raise BackendError(f"step {step}: scoring {side} the images returned {len(toks)} positions for "
                                   f"{len(out.tokens)} tokens")
        inf = token_influence(with_tokens, sc2.tokens, think)
        value = influence_of(self.policy.signal, inf["kl_mean"], inf["dH_mean"])
        below = bool(np.isfinite(value) and value < self.policy.threshold)
        if np.isfinite(value):  # a step without think tokens says nothing: the streak stays as it was
            self.streak = self.streak + 1 if below else 0
        decision = "keep"
        if self.streak >= self.policy.patience and self.unload_step is None:
            self.detect_step, self.unload_step, decision = step, step + 1, "unload"
        self.probes += 1
        self.scoring_calls += calls
        self.scored_tokens += calls * len(out.tokens)
        dt = time.monotonic() - t0
        self.seconds += dt
        self.influences.append(value)
        # per token, beside the step's own arrays in the sidecar (NaN outside the think segment)
        arrays = ep.traj.tokens.get(step)
        if arrays is not None:
            n = len(arrays["id"])
            kl_col, dh_col = np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32)
            kl_col[inf["pos"]], dh_col[inf["pos"]] = inf["kl"], inf["dH"]
            arrays["unload_kl"], arrays["unload_dH"] = kl_col, dh_col
        return ep.traj.unload_probe(
            ev, signal=self.policy.signal, influence=_num(value), kl=_num(inf["kl_mean"]), dH=_num(inf["dH_mean"]),
            H_with=_num(inf["H_with"]), H_without=_num(inf["H_without"]), n_think=int(np.sum(think)),
            threshold=self.policy.threshold, below=below, streak=self.streak, decision=decision,
            unload_step=self.unload_step, scoring_calls=calls, latency_s=round(dt, 4))

    def summary(self) -> dict:
        return {**self.policy.to_dict(), "detect_step": self.detect_step, "unload_step": self.unload_step,
                "probes": self.probes, "scoring_calls": self.scoring_calls, "scored_tokens": self.scored_tokens,
                "probe_seconds": round(self.seconds, 3),
                "influences": [_num(v) for v in self.influences]}


def _num(v) -> float | None:
    return None if v is None or not np.isfinite(v) else round(float(v), 6)
