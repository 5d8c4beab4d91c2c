"""The ``mmcf`` console command: one front door whose subcommands are the toolkit's programs.

    mmcf --help                    # every command with one line
    mmcf run --method react ...    # exactly python -m agent.run --method react ...
    mmcf entropy RUN --help        # exactly python -m probes.entropy RUN --help

A subcommand runs its module as ``python -m`` does (``runpy``, as ``__main__``, with the same arguments), so every
command behaves, exits and answers ``--help`` the same way under both names. This module imports nothing of the
toolkit: ``mmcf --help`` and a misspelled command are answered by the standard library alone.
"""
from __future__ import annotations

import difflib
import os
import runpy
import sys

__all__ = ["COMMANDS", "main"]

#: name -> (the module ``python -m`` runs, what it does in one line). The order is the order of a study.
COMMANDS = {
    "preflight": ("agent.preflight", "check every key, server and image a chain of commands needs, before it starts"),
    "benchmarks": ("agent.benchmarks", "benchmark manifests: stats, problems and subsets"),
    "launch": ("serving.launch", "start the model servers (SGLang, or vLLM) for the Qwen3.5 backbones"),
    "check": ("serving.check", "smoke-test a model server: one image+text request with top-20 logprobs"),
    "gateway": ("serving.gateway", "one gateway over the servers of several nodes"),
    "stop": ("serving.stop", "stop the servers the launcher started, and nothing else"),
    "run": ("agent.run", "run an agent (ReAct, MM-ContextFold, baselines) over a benchmark; resumable"),
    "judge": ("agent.judge", "grade a run's answers (the paper's LLM judge, or exact match); judge agreement"),
    "show": ("agent.show", "look at a run's trajectories in the terminal or as HTML"),
    "rundir": ("agent.rundir", "check a run directory, export it, merge shards, write the record's schemas"),
    "ledger": ("agent.ledger", "what a run cost: calls, tokens, GPU time, money"),
    "grounding": ("probes.grounding", "the grounding annotation of each step (Figure 2a)"),
    "entropy": ("probes.entropy", "think entropy with vs without the query images (Figure 2b)"),
    "removal": ("probes.removal", "step-k image-removal replays (Figure 2c)"),
    "fidelity": ("probes.fidelity", "is the server fit to be probed: repeats, reference model, logprob mode"),
    "calibrate-unload": ("probes.calibrate_unload", "calibrate adaptive image unloading on the probes' labels"),
    "prefix-cache": ("probes.prefix_cache", "what a probe reuses from the server's prefix cache"),
    "report": ("analysis.report", "every figure and table the runs and probes allow, in one command"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mmcf COMMAND [ARGS...]   (each command: mmcf COMMAND --help)", "",
             "MM-ContextFold toolkit: agents, probes and figures on self-hosted models.", "", "commands:"]
    lines += [f"  {name:<{width}}  {doc}  (python -m {module})" for name, (module, doc) in COMMANDS.items()]
    lines += ["", "examples:", "  mmcf run --method react --limit 2 --out runs/demo-react",
              "  mmcf entropy runs/demo-react", "  mmcf report --react runs/demo-react --out runs/demo-react/figures"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        try:
            print(usage(), flush=True)
        except BrokenPipeError:  # mmcf --help | head: the reader had enough
            sys.stdout = open(os.devnull, "w")
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        near = difflib.get_close_matches(name, COMMANDS, n=1)
        print(f"mmcf: no command {name!r}" + (f"; did you mean {near[0]!r}?" if near else "")
              + " (mmcf --help lists them)", file=sys.stderr)
        return 2
    module = COMMANDS[name][0]
    sys.argv = [f"mmcf {name}", *rest]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # the command's own exit status
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
