"""Reading a run directory: :class:`Run` (header, the index of line summaries, lines read on access, token
sidecars, the exact messages of a call) and :func:`load_run`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..record import RunHeader
from .common import RunError, inside
from .index import Lines, summary_of
from .lines import SEAL_KEY
from .sidecar import decode as _decode_sidecar
from .sidecar import read_prompt_pieces as _read_prompt_pieces
from .sidecar import read_sidecar
from .writer import RunDir


class Run:
    """A run directory opened for reading: ``header`` (its model, :class:`agent.record.RunHeader`), ``index`` (every latest line's summary: the line without
    its events and messages, kept in memory), ``lines`` (the whole lines, read on access, see :class:`Lines`)."""

    def __init__(self, path, header: RunHeader, index: list[dict] | None = None, *, lines: list[dict] | None = None):
        self.path = Path(path)
        self.changed: list = []  # (sample_id, trial, byte offset) of lines changed since written (left out)
        self.header = header
        self._lines: list[dict] | None
        if lines is not None:  # built in memory (tests, notebooks)
            self.index = [summary_of(ln) | {"_line": ln} for ln in lines]
            self._lines = list(lines)
        else:
            self.index = index or []
            self._lines = None

    @property
    def lines(self):
        if self._lines is not None:
            return self._lines
        return Lines(self.path / "results.jsonl", self.index)

    def seals(self) -> dict[tuple[str, int], str]:
        """The seal (``line_sha256``) of each latest line by (sample_id, trial): what a grade or a probe's row computed
        from that line names as its source (``source_sha256``)."""
        return {(e["sample_id"], int(e["trial"])): e[SEAL_KEY] for e in self.index if e.get(SEAL_KEY)}

    def full(self, line: dict) -> dict:
        """The whole line (events and messages) of a summary or a line."""
        if "events" in line or "messages" in line:
            return line
        if "_line" in line:
            return line["_line"]
        if "_o" not in line:
            raise RunError(f"{line.get('sample_id')}: not a line of {self.path}")
        return Lines(self.path / "results.jsonl", [line])[0]

    def tokens_path(self, line: dict) -> Path | None:
        """The line's token sidecar, checked to lie inside the run directory (None when it recorded no tokens)."""
        if not line.get("tokens_file"):
            return None
        return inside(self.path, line["tokens_file"], f"{self.path / 'results.jsonl'} ({line.get('sample_id')} "
                                                      f"trial {line.get('trial')}): tokens_file")

    def tokens(self, line: dict, columns: list[str] | None = None) -> dict[str, np.ndarray]:
        """The line's per-token arrays (``columns`` to read only some: the sidecar is columnar), from the sidecar
        whose bytes the line was written with (``tokens_sha256``)."""
        p = self.tokens_path(line)
        if p is None:
            return {}
        try:
            return _decode_sidecar(p, columns, sha256=line.get("tokens_sha256"))
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e}); python -m agent.rundir check {self.path}") from None

    def token_table(self, line: dict, columns: list[str] | None = None, *, filters=None):
        """The line's sidecar as an Arrow table, as stored (checked as :meth:`tokens` is; ``columns`` and pyarrow
        row ``filters`` to read only some); None without one."""
        p = self.tokens_path(line)
        if p is None:
            return None
        try:
            return read_sidecar(p, columns, sha256=line.get("tokens_sha256"), filters=filters)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e}); python -m agent.rundir check {self.path}") from None

    def prompt_pieces(self, line: dict) -> tuple[str | None, dict]:
        """(tokenizer fingerprint, {digest: ids}): the token ids of the line's prompts by message piece, as its
        backend sent them (agent/backends/pieces.py); ``(None, {})`` when the run did not record them."""
        p = self.tokens_path(line)
        if p is None:
            return None, {}
        try:
            return _read_prompt_pieces(p)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable prompt ids in the token sidecar ({e}); probe with --retokenize to "
                           "tokenise the prompts again instead") from None

    def call_event(self, line: dict, call: int | dict) -> dict:
        """The ``llm_call`` event of ``call``: the event itself, or its 1-based call index."""
        if isinstance(call, dict):
            return call
        for ev in self.full(line).get("events") or []:
            if ev.get("type") == "llm_call" and ev.get("index") == call:
                return ev
        raise RunError(f"{line.get('sample_id')} trial {line.get('trial')}: no LLM call #{call} "
                       f"(it made {line.get('n_calls')})")

    def call_messages(self, line: dict, call: int | dict) -> list[dict]:
        """The exact messages of one call (the event, or its 1-based index)."""
        line = self.full(line)
        return [line["messages"][i] for i in self.call_event(line, call)["message_ids"]]

    def sendable_messages(self, line: dict, call_event: int | dict) -> list[dict]:
        """The call's messages ready to send again: each recorded image part points at the stored image."""
        out = []
        for m in self.call_messages(line, call_event):
            c = m.get("content")
            if isinstance(c, list):
                parts = []
                for p in c:
                    if isinstance(p, dict) and p.get("type") == "image":
                        if p.get("url"):
                            parts.append({"type": "image_url", "image_url": {"url": p["url"]}})
                            continue
                        path = self.image_path(p["sha256"])
                        if path is None:
                            raise RunError(f"{self.path}/images: image {p['sha256'][:12]}… of {line['sample_id']} "
                                           f"is not stored (was the run directory copied without images/?)")
                        # the hash rides along: removing query images never needs to read the file again
                        parts.append({"type": "image_url", "image_url": {"url": str(path)}, "sha256": p["sha256"]})
                    else:
                        parts.append(p)
                m = {**m, "content": parts}
            out.append(m)
        return out

    def image_path(self, sha256: str) -> Path | None:
        d: dict[str, Path] | None = getattr(self, "_images", None)
        if d is None or sha256 not in d:  # listed once (and again when an image is not found: it may be new)
            d = {}
            if (self.path / "images").is_dir():
                for f in (self.path / "images").iterdir():
                    d.setdefault(f.name.split(".")[0], f)
            self._images = d
        p = d.get(sha256)
        # a stored image that is a symlink leading out of the run directory is never read (nor embedded in a page)
        return None if p is None else inside(self.path / "images", p.name, f"{self.path / 'images'}")


def load_run(path, project=None) -> Run:
    """The run at ``path``; ``project``: keep only that of each line's summary in ``run.index`` (a function of the
    summary: see :meth:`agent.rundir.index.RunIndex.index`), for readers of thousands of lines."""
    rd = RunDir(path)
    header = rd.read_header_record()
    run = Run(rd.path, header, list(rd.latest(project).values()))  # summaries; whole lines are read on access
    run.changed = list(rd.changed)  # lines left out: changed since they were written (warned by the index)
    return run
