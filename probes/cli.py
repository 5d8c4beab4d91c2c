"""The probe commands' shared flags, in the standard library alone (``--help`` and a usage error answer before the
probe's work loads; what the probes share once their arguments parse: probes/session.py).

    add_backend_args(parser)     # --backend/--endpoint/--model/--model-dir/--logprob-mode, the run's by default
    add_retokenize_arg(parser)   # --retokenize
"""
from __future__ import annotations

from agent.cli import add_backend_args as add
from agent.cli import positive_int

__all__ = ["add_backend_args", "add_retokenize_arg", "PROBE_CONCURRENCY", "ENTROPY_MODES"]

#: The entropy probe's modes: regenerate = the paper's (resample under τ^IR, §3.2.2); teacher-forced = score the
#: recorded tokens (ours).
ENTROPY_MODES = ("regenerate", "teacher-forced")

#: Trajectories (each with one request in flight) per model server when a probe talks to servers (ours). A
#: probe request is one trajectory's step: a ~1-9k-token prompt, much of it a cached prefix, and up to ~1k
#: generated tokens. SGLang batches hundreds of such requests on one TP=4 group (its --max-running-requests is
#: sized by the KV pool) and queues the rest, so 128 per server keeps a group's batch full while the client's CPU
#: and memory stay small beside it (docs/performance.md: the probe's cost at this concurrency).
PROBE_CONCURRENCY = 128


def add_backend_args(ap) -> None:
    """The model-server options, defaulting to the backend that recorded the run (agent/cli.py)."""

    add(ap, from_run=True, repeat_endpoint=True)
    ap.add_argument("--gpus-per-server", type=positive_int, default=None,
                    help="GPUs behind each endpoint (for GPU-seconds in probe.json; default: read from the "
                         "launcher's endpoints.json, else unknown)")
    ap.add_argument("--nested-logprobs", action="store_true",
                    help="score with SGLang's nested [logprob, id, text] lists instead of its flat base64 arrays "
                         "(the same numbers; the flat ones cost the client ~a tenth of the decode)")
    ap.add_argument("--serve-dir", dest="serving_dir", default=None,
                    help="the launcher's --serve-dir whose endpoints.json describes the endpoints (default: the ones "
                         "python -m serving.launch remembered on this machine)")


def add_retokenize_arg(ap) -> None:
    """``--retokenize`` (the probes that send the run's prompts again: entropy, removal)."""
    ap.add_argument("--retokenize", action="store_true",
                    help="tokenise every prompt again instead of sending the token ids the run recorded for it (a run "
                         "made with --backend sglang records them; agent/backends/pieces.py): a check, or a baseline")
