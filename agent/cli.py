"""The one command-line vocabulary of every ``python -m`` command (and what each prints when it ends).

    from agent.cli import make_parser, add_backend_args, add_judge_args, done
    ap = make_parser("python -m probes.entropy", __doc__, ["python -m probes.entropy runs/react"])

- the model server: ``--backend local|sglang|openai|scripted``, ``--endpoint URL`` (repeatable where several
  replicas can share the load, refused when repeated elsewhere), ``--model``, ``--model-dir``,
  ``--logprob-mode raw|scaled``, ``--server sglang|vllm|openrouter|other``, ``--api-key-env VAR``;
- the grader of a judge or an annotator: ``--judge-endpoint``, ``--judge-model``, ``--judge-api-key-env``;
  ``--judge`` picks the judge itself (``llm|exact`` where answers are graded, ``llm|local|scripted`` for the
  grounding annotator);
- a directory a command writes: ``--out`` (the launcher's: ``--serve-dir``, which the probes and the ledger read);
- ``--retries N`` counts transport retries (``serving.check``); ``--re-asks N`` an annotator's re-asks of an unusable
  reply; ``--retry-errors`` / ``--retry-unparsed`` redo, on a rerun, the units that ended so;
- an old spelling (:data:`RENAMED`) still works for now, with a one-line notice;
- ``--concurrency`` defaults to :data:`DEFAULT_CONCURRENCY` everywhere;
- every option's help says its default, every ``--help`` ends with examples, and every command ends by
  saying where its outputs are and the next command to run (:func:`done`).
"""
from __future__ import annotations

import argparse
import difflib
import logging
import os
import re
import sys

from .redact import RedactingStream

__all__ = ["Parser", "setup_logging", "printable", "number_in", "temperature", "top_p", "top_logprobs", "port_number", "make_parser", "add_backend_args", "add_judge_args", "single_endpoint", "done", "DEFAULT_CONCURRENCY",
           "SERVERS", "BACKEND_CHOICES", "JUDGE_ENDPOINT", "JUDGE_MODEL", "positive_int", "positive_float"]

#: Requests (samples, steps, grades) in flight, the same default for every command.
DEFAULT_CONCURRENCY = 8
SERVERS = ("sglang", "vllm", "openrouter", "other")
BACKEND_CHOICES = ("local", "sglang", "vllm", "openai", "scripted")
JUDGE_ENDPOINT = "https://openrouter.ai/api/v1"
#: Gemini-3-Flash (paper B.6) as OpenRouter serves it (openrouter.ai/google/gemini-3-flash-preview, looked up
#: 2026-12): the one constant behind every default, help text and the README.
JUDGE_MODEL = "google/gemini-3-flash-preview"


#: What a terminal must never receive from data: control characters other than newline and tab (an escape sequence
#: in a model's reply would recolour, move or clear the user's terminal, or retitle its window).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` fit for a terminal: each control character but newline and tab shown as its escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the description and examples as written, and says every option's default."""

    def _get_help_string(self, action):
        h = action.help or ""
        if "(default" in h or action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            return h + (" (default: off)" if action.nargs == 0 and "(default" not in h and action.default is False else "")
        return h + " (default: %(default)s)"


def _interrupted_hook(kind, value, tb) -> None:
    """An uncaught Ctrl-C: one line (what is kept and how to go on) instead of a traceback; anything else as
    Python prints it. Python still ends the process as killed by SIGINT (status 130 in a shell). A reader that
    went away (``| head``: a broken pipe) is not an error: nothing is printed, not even at exit."""
    if issubclass(kind, BrokenPipeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit goes nowhere
        return
    if issubclass(kind, KeyboardInterrupt):
        print("\ninterrupted (Ctrl-C): every output finished so far is kept; rerun the same command to go on",
              file=sys.stderr)
        return
    sys.__excepthook__(kind, value, tb)


class _ConsoleHandler(logging.StreamHandler):
    """Writes each message as its own line to whatever ``sys.stderr`` is when it is written (the redacting stream
    the parser installs; a test's capture)."""

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


#: The toolkit's loggers: what every command says on stderr goes through them (``logging``), as a line of its own.
LOGGERS = ("agent", "probes", "analysis", "serving", "scripts", "__main__")  # (a single-file command runs as __main__)


def setup_logging(level: int = logging.INFO) -> None:
    """Send the toolkit's log records to stderr as plain lines (the message alone, as the commands always printed
    them); other libraries' loggers are left as they are. Every command's parser calls it; a notebook may too."""
    for name in LOGGERS:
        lg = logging.getLogger(name)
        if not any(isinstance(h, _ConsoleHandler) for h in lg.handlers):
            h = _ConsoleHandler()
            h.setFormatter(logging.Formatter("%(message)s"))
            lg.addHandler(h)
        lg.setLevel(level)
        lg.propagate = False


class Parser(argparse.ArgumentParser):
    """argparse, except that an unknown flag is reported first, with the closest known one (argparse would say
    only "required: --method" for a mistyped ``--methd react``)."""

    def parse_known_args(self, args=None, namespace=None):
        # every command parses its arguments first: from here on its console never shows a key's value
        for name in ("stdout", "stderr"):
            if not isinstance(getattr(sys, name), RedactingStream):
                setattr(sys, name, RedactingStream(getattr(sys, name)))
        if sys.excepthook is sys.__excepthook__:  # and Ctrl-C ends it with one line, not a traceback
            sys.excepthook = _interrupted_hook
        setup_logging()
        argv = list(sys.argv[1:] if args is None else args)
        known = {o for a in self._actions for o in a.option_strings}
        argv = _renamed(argv, known)
        args = argv
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            # the flags before the subcommand are this parser's; the subcommand's own parser (a Parser too) checks
            # the rest
            argv = argv[:next((i for i, t in enumerate(argv) if not t.startswith("-")), len(argv))]
        for tok in argv:
            if tok == "--":
                break
            flag = tok.split("=", 1)[0]
            if flag.startswith("--") and flag not in known and not any(k.startswith(flag) for k in known):
                close = difflib.get_close_matches(flag, sorted(known), n=1)
                self.error(f"unrecognized argument: {flag}" + (f" (did you mean {close[0]}?)" if close else ""))
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        """The mistake and the way to the options, in two lines: not the whole usage first (a 34-line usage
        buried the one line that named the right flag)."""
        self.exit(2, f"{self.prog}: error: {message}\n  {self.prog} --help lists the options\n")


#: Flags renamed in this version, old -> new: the old name still works, with a notice, until the next one. The
#: adaptive image release is now "unloading" (``release`` names the authors' released code, ``--protocol release``).
RENAMED = {"--image-release": "--image-unload", "--release-signal": "--unload-signal",
           "--release-threshold": "--unload-threshold", "--release-patience": "--unload-patience",
           "--release-runs": "--unload-runs",
           # one spelling per idea (issue 82): the launcher's directory, the logprob mode
           "--run-dir": "--serve-dir", "--serving-dir": "--serve-dir", "--logprobs": "--logprob-mode",
           # --judge picks the judge everywhere; --retries is a count of transport retries (serving.check) only
           "--judge-backend": "--judge", "--retries": "--re-asks"}


def _renamed(argv: list, known: set) -> list:
    out = []
    for tok in argv:
        flag, eq, value = tok.partition("=")
        new = RENAMED.get(flag)
        if new in known:
            print(f"notice: {flag} is now {new}; the old name works in this version only", file=sys.stderr)
            tok = new + eq + value
        out.append(tok)
    return out


def positive_int(v: str) -> int:
    """An argparse type: a whole number >= 1 (``--limit -2`` is refused, naming the value)."""
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def positive_float(v: str) -> float:
    """An argparse type: a finite number > 0 (``--timeout -5`` is refused, naming the value)."""
    try:
        x = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a number") from None
    if not (0 < x < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number above 0, got {v}")
    return x


def number_in(lo: float, hi: float, *, lo_open: bool = False, whole: bool = False):
    """An argparse type: a finite number in [lo, hi] ((lo, hi] with ``lo_open``; a whole number with ``whole``):
    ``--temperature nan``, ``--top-p 7``, ``--top-logprobs -1``, ``--port 99999`` are refused, naming the value."""
    def parse(v: str):
        try:
            x = int(v) if whole else float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{v!r} is not a {'whole ' if whole else ''}number") from None
        if x != x or not (lo < x if lo_open else lo <= x) or not x <= hi:
            raise argparse.ArgumentTypeError(f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v}")
        return x
    parse.__name__ = "number"
    return parse


#: The command-line types of the sampling parameters (paper B.1's values are inside every range).
temperature = number_in(0.0, 100.0)
top_p = number_in(0.0, 1.0, lo_open=True)
top_logprobs = number_in(0, 1024, whole=True)
port_number = number_in(1, 65535, whole=True)
fraction = number_in(0.0, 1.0, lo_open=True)


def make_parser(prog: str, doc: str | None, examples: list[str]) -> argparse.ArgumentParser:
    """A parser whose description is the first paragraph of ``doc`` and whose help ends with the examples."""
    desc = (doc or "").strip().split("\n\n")[0]
    return Parser(prog=prog, description=desc, formatter_class=HelpFormatter,
                  epilog="examples:\n" + "\n".join(f"  {e}" for e in examples))


def add_backend_args(ap, *, default: str | None = "local", from_run: bool = False, repeat_endpoint: bool = False,
                     title: str | None = None) -> None:
    """The model-server options. ``from_run``: the default is the backend that recorded the run."""
    g = ap.add_argument_group(title or ("model backend (default: the one that recorded the run)" if from_run
                                        else "model backend"))
    g.add_argument("--backend", choices=BACKEND_CHOICES, default=None if from_run else default,
                   help="local = in-process transformers (no --model-dir: the embedded tiny random Qwen3.5); "
                        "sglang = SGLang native /generate (needed for scoring); vllm = vLLM's chat API, and its /v1/completions for scoring without images; openai = an OpenAI-compatible chat "
                        "server; scripted = a FAKE demo model (agent/backends/demo_model.py)"
                        + (" (default: the run's)" if from_run else ""))
    g.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="model server URL" + ("; repeat it to spread the load over replicas" if repeat_endpoint
                                              else " (one)") + (" (default: the run's)" if from_run else ""))
    g.add_argument("--model", help="served model name (default: what the server lists first)")
    g.add_argument("--model-dir", help="weights / tokenizer directory or a hub id in the local HF cache "
                                       "(local: the model; sglang: its chat template and processor)")
    g.add_argument("--logprob-mode", choices=("raw", "scaled"), default=None if from_run else "scaled",
                   help="what the server's output logprobs describe (must match serving/launch_qwen35.sh --logprobs)"
                        + (" (default: the run's)" if from_run else ""))
    g.add_argument("--server", choices=SERVERS, default="sglang",
                   help="openai backend: which kind of server (SGLang gets return_meta_info)")
    g.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the model server's API key")


def add_judge_args(ap, *, role: str = "judge", repeat_endpoint: bool = False) -> None:
    """The grader's server (the LLM judge, or the grounding annotator): --judge-endpoint / -model / -api-key-env."""
    g = ap.add_argument_group(f"the {role}'s server (paper: {JUDGE_MODEL} on OpenRouter)")
    if repeat_endpoint:  # a list; the caller falls back to JUDGE_ENDPOINT when it is empty
        g.add_argument("--judge-endpoint", action="append", default=[], metavar="URL",
                       help=f"the {role}'s OpenAI-compatible server (default {JUDGE_ENDPOINT}); repeat it to spread "
                            "the trajectories over replicas of one model")
    else:
        g.add_argument("--judge-endpoint", default=JUDGE_ENDPOINT, metavar="URL", help=f"the {role}'s OpenAI-compatible server")
    g.add_argument("--judge-model", default=JUDGE_MODEL, help=f"the {role} model")
    g.add_argument("--judge-api-key-env", metavar="VAR",
                   help="environment variable with its key (default: OPENROUTER_API_KEY for OpenRouter, none otherwise)")


def single_endpoint(a) -> str | None:
    """The one --endpoint a command takes (refuses several, which only the runner spreads the load over)."""
    eps = a.endpoint or []
    if len(eps) > 1:  # a refused argument: exit 2, like every other (SystemExit with a string exits 1)
        print(f"error: this command talks to one model server; got --endpoint {len(eps)} times "
              "(python -m agent.run and the probes spread their work over several)", file=sys.stderr)
        raise SystemExit(2)
    return eps[0] if eps else None


def done(outputs, next_cmd: str | None = None, *, file=None) -> None:
    """The last lines of every command: where its outputs are, and what to run next."""
    file = file or sys.stdout
    outs = [str(o) for o in outputs if o]
    if outs:
        print("outputs: " + (outs[0] if len(outs) == 1 else "\n  " + "\n  ".join(outs)), file=file)
    if next_cmd:
        print(f"next: {next_cmd}", file=file)
