"""The entropy probe's work once its arguments parse: the probe of a run (the serving-fidelity check first), or the
embedded demo (probes/entropy/cli.py holds the flags)."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from agent.backends import make_backend
from agent.cli import done
from agent.preflight import PreflightError
from agent.run import RunConfig, run
from agent.rundir import load_run
from analysis.estimators.entropy import FORK_SHARE
from analysis.figures import fig2b_entropy, fig2b_forking, fig2b_kl, provenance_mark
from probes.fidelity import check_servers, refusal
from probes.session import (
    backend_for,
    keeps_unparsed,
    probe_concurrency,
    probe_model_check,
    run_async,
    serving_hardware,
)

from .probe import check_probeable, probe_run

__all__ = ["entropy_command"]

log = logging.getLogger(__name__)

DEMO_BANNER = """\
==========================================================================================
 probes.entropy DEMO on the EMBEDDED DEFAULT: a tiny, RANDOMLY INITIALISED Qwen3.5 and the
 offline demo world. Every entropy and ΔH below is MEANINGLESS: the point is that the whole
 pipeline (collect ReAct trajectories -> strip images -> regenerate -> ΔH -> Figure 2(b)) runs.
 Run it on a served Qwen3.5 (README: "On a GPU node") for real numbers.
=========================================================================================="""


def _print_summary(s) -> None:
    cols = [c for c in ("step", "n", "mean", "ci_low", "ci_high", "dH_low", "dH_high", "sign_robust", "wilcoxon_p",
                        "excluded_no_think", "H_with", "H_without", "kl_with_without", "dH_exact", "gap_with") if c in s]
    print(s[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}"))


def draw_panels(res: dict) -> None:
    """The probe's panels beside its tables (the command's view; :func:`probe_run` draws nothing): Figure 2(b)'s
    ΔH per step with its bound band, the forking tokens, and (teacher-forced) the KL influence per step."""
    out, mode, model, summary = res["out"], res["mode"], res["model"], res["summary"]
    mark = provenance_mark([res["header"]])
    fig2b_entropy(summary, out / "fig2b_entropy", title=f"Figure 2(b): ΔH per step ({model}, {mode})", mark=mark)
    fork = res["forking"]
    if fork is not None and len(fork):
        fig2b_forking(fork, summary, out / "fig2b_forking",
                      title=f"Forking tokens (top {FORK_SHARE:.0%} by entropy; {model}, {mode})", mark=mark)
    if "kl_with_without" in summary and np.isfinite(summary["kl_with_without"]).any():
        fig2b_kl(summary, out / "fig2b_kl_influence", title=f"Image influence per step ({model}, teacher-forced)",
                 mark=mark)


async def _demo(args) -> int:
    print(DEMO_BANNER, flush=True)
    out = Path(args.demo_dir)
    print(f"\n[1/2] collecting {args.demo_samples} ReAct trajectories on the demo benchmark -> {out}", flush=True)
    await run(RunConfig(method="react", out=str(out), benchmark="demo", limit=args.demo_samples, t_max=4,
                        max_tokens=24, concurrency=1, seed=0, progress=not args.no_progress), [])
    print(f"\n[2/2] probing every image-bearing step ({args.mode})", flush=True)

    backend = make_backend("local")
    try:
        # the tiny random model never emits a valid action: the paper's rule would exclude every trajectory
        # the serving-fidelity check first, as on a server (in-process: the warm repeat only; probes/fidelity/)
        rep = await check_servers(out, backend, samples=args.demo_samples)
        warm = rep["checks"]["warm"]
        print(f"serving fidelity: {'ok' if rep['ok'] else 'FAILED'} (warm repeat: max |Δlogprob| "
              f"{warm.get('max_abs', float('nan')):.2g}; cold, local and paths need a server) -> "
              f"{out}/probes/fidelity/fidelity.json", flush=True)
        fidelity = {"ok": rep["ok"], "forced": False, "failed": rep["failed"],
                    "report": str(out / "probes" / "fidelity" / "fidelity.json")}
        print("(demo: --include-unparsed, since the random model's first calls never parse)", flush=True)
        res = await probe_run(out, mode=args.mode, backend=backend, progress=not args.no_progress,
                              include_unparsed=True, fidelity=fidelity)
    finally:
        await backend.aclose()
    draw_panels(res)
    _print_summary(res["summary"])
    print(f"\nwrote {res['out']}/steps.parquet, summary.csv, forking.csv, bounds per step; fig2b_entropy.png/.pdf "
          "(with the bound band), fig2b_forking.png/.pdf")
    print("(random weights: every number above is meaningless)")
    return 0


async def _fidelity_first(args, backend) -> dict:
    """The serving-fidelity check before a probe (probes/fidelity/): refused (PreflightError, exit 2) when a
    check fails, unless --force; skipped (and said so in probe.json) with --skip-fidelity and for backends that
    cannot score (the OpenAI-compatible chat path). In-process and scripted models get the warm check only."""

    members = list(getattr(backend, "backends", None) or [backend])
    if args.skip_fidelity:
        return {"skipped": "--skip-fidelity"}
    # the OpenAI-compatible chat path has no teacher-forced scoring (its score() refuses)
    cannot = [getattr(b, "name", "?") for b in members if getattr(b, "name", "") == "openai"
              or not callable(getattr(b, "score", None))]
    if cannot:
        return {"skipped": f"the backend cannot score recorded tokens ({cannot[0]})"}
    out = Path(args.out).parent / "fidelity" if args.out else None
    rep = await check_servers(args.run_dir, backend, out_dir=out, force=args.force, retokenize=args.retokenize)
    if not rep["ok"]:
        if not args.force:
            raise PreflightError(refusal(rep))
        log.warning(f"warning: --force: {refusal(rep)}")
    return {"ok": rep["ok"], "forced": rep.get("forced", False), "failed": rep["failed"],
            "report": str((out or Path(args.run_dir) / "probes" / "fidelity") / "fidelity.json")}


def entropy_command(args) -> int:
    """``python -m probes.entropy`` once its arguments parse: the probe of ``args.run_dir``, or the demo."""
    if not args.run_dir:
        rc, code = run_async(_demo(args), "finished steps and trajectories")
        return code or rc

    async def go():
        run = load_run(args.run_dir)
        check_probeable(run)
        backend = backend_for(args, run.header)
        try:
            hw = serving_hardware(backend, gpus_per_server=args.gpus_per_server, serving_dir=args.serving_dir)
            # the model first: a server of another model would fail the fidelity check for the wrong reason
            await probe_model_check(run, backend, force=args.force)
            fidelity = await _fidelity_first(args, backend)
            return await probe_run(args.run_dir, mode=args.mode, backend=backend, out_dir=args.out, hardware=hw,
                                   fidelity=fidelity,
                                   concurrency=probe_concurrency(args, backend), limit=args.limit, progress=not args.no_progress,
                                   force=args.force, include_unparsed=keeps_unparsed(args.include_unparsed, run.header),
                                   retokenize=args.retokenize)
        finally:
            await backend.aclose()

    res, code = run_async(go(), "finished steps", args.out or Path(args.run_dir) / "probes" / f"entropy-{args.mode}")
    if code:
        return code
    draw_panels(res)
    _print_summary(res["summary"])
    out = res["out"]
    done([f"{out}/ (steps.parquet, steps.csv, summary.csv, exclusions.csv, probe.json, fig2b_entropy.png/.pdf)"],
         f"python -m probes.removal {args.run_dir}   |   python -m analysis.report --react {args.run_dir}")
    return 1 if res["failures"] else 0
