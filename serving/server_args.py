"""Each server's command line read by SGLang's own parser, before anything starts (``serving/launch.py``'s preflight,
``--dry-run`` included):

    echo '{"servers": [[ARGS...]], "extra": [EXTRA...]}' | python -m serving.server_args    # -> a JSON list

run on the Python that will start the servers (SGLang imported there; the launcher's own Python may lack it).
``ARGS`` are the arguments the launcher gives ``sglang.launch_server``, ``EXTRA`` what ``SGLANG_EXTRA_ARGS`` adds.
Printed: one line per problem, each a reason the server would refuse to start or would start other than planned:

- an argument SGLang does not know, or a value it refuses (its parser's own message);
- ``SGLANG_EXTRA_ARGS`` giving again an option the launcher sets (the last one wins in SGLang's parser, so the
  plan, the memory estimate and the launch record would describe another server);
- ``--disable-radix-cache`` with the launcher's ``--mamba-radix-cache-strategy extra_buffer``: SGLang 0.5.23 starts,
  with no radix cache and the pinned strategy dropped (``mamba_extra_buffer_of`` is false once the cache is off,
  sglang/srt/arg_groups/model_override_base.py, so ``handle_mamba_radix_cache``, model_hook.py, neither uses nor
  refuses it): no prefix is reused, and every probe request pays its whole prompt.
"""
from __future__ import annotations

import argparse
import json
import sys

from agent.errors import UsageError

__all__ = ["PINNED", "problems", "main"]

#: What the launcher sets on every server (serving/plan.py ``server_command``), by SGLang's option name.
PINNED = ("model_path", "served_model_name", "tp_size", "host", "port", "nccl_port", "reasoning_parser",
          "mem_fraction_static", "context_length", "mamba_radix_cache_strategy", "mamba_ssm_dtype",
          "enable_deterministic_inference")


class _Refused(UsageError):
    """SGLang's parser refused an argument (its message); reported as a check's FAIL line, never raised further."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # SGLang's parser's message, returned instead of printed with the usage and exit 2
        raise _Refused(message)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def problems(args: list[str], extra: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """What SGLang's ``parser`` finds wrong with one server's ``args`` + ``extra`` (module docstring)."""
    try:
        planned = parser.parse_args(args)
    except _Refused as e:
        return [f"the launcher's own arguments: SGLang refuses them ({e}): a launcher bug, please report it"]
    try:
        full = parser.parse_args(args + extra)
    except _Refused as e:
        return [f"SGLANG_EXTRA_ARGS={' '.join(extra)!r}: SGLang refuses it: {e}"]
    out = []
    for dest in PINNED:
        was, now = getattr(planned, dest, None), getattr(full, dest, None)
        if was != now:
            out.append(f"SGLANG_EXTRA_ARGS sets {_flag(dest)} {now}, which the launcher sets to {was}: give it "
                       "as the launcher's own option (the plan, the memory estimate and the record would describe "
                       "another server)")
    strategy = getattr(full, "mamba_radix_cache_strategy", None)
    if getattr(full, "disable_radix_cache", False) and strategy in ("extra_buffer", "extra_buffer_lazy"):
        out.append(f"SGLANG_EXTRA_ARGS: --disable-radix-cache drops --mamba-radix-cache-strategy {strategy}, which "
                   "the launcher pins for Qwen3.5's linear-attention states: SGLang would start with no prefix cache "
                   "at all (arg_groups/model_override_base.py mamba_extra_buffer_of: no buffer once the cache is "
                   "off), and every probe request would pay its whole prompt; leave the radix cache on")
    return out


def main() -> int:
    from sglang.srt.server_args import ServerArgs  # noqa: PLC0415 - the optional serve extra, on the servers' Python

    req = json.load(sys.stdin)
    parser = _Parser(prog="sglang.launch_server", add_help=False)
    ServerArgs.add_cli_args(parser)
    found: list[str] = []
    for args in req["servers"]:
        found += [p for p in problems(list(args), list(req.get("extra") or []), parser) if p not in found]
    print(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
