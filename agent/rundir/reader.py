"""Reading a run directory: :class:`Run` (header, the index of line summaries, lines read on access, token
sidecars, the exact messages of a call) and :func:`load_run`."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..record import LineSummary, LlmCall, Message, ResultLine, RunHeader
from ..record.line import ImagePart
from .common import RunError, inside
from .index import Lines, RunIndex, plain_fields, position, raw_line, read_header, summary_model
from .lines import SEAL_KEY
from .sidecar import decode as _decode_sidecar
from .sidecar import read_prompt_pieces as _read_prompt_pieces
from .sidecar import read_sidecar


class Run:
    """A run directory opened for reading: ``header`` (its model, :class:`agent.record.RunHeader`), ``index`` (every
    latest line's summary, :class:`agent.record.LineSummary`: the line without its events and messages, kept in
    memory), ``lines`` (the whole lines, :class:`agent.record.ResultLine`, read on access, see :class:`Lines`)."""

    def __init__(self, path, header: RunHeader, entries: list[dict], fields: frozenset[str] | None = None):
        self.path = Path(path)
        self.changed: list = []  # (sample_id, trial, byte offset) of lines changed since written (left out)
        self.header = header
        where = f"{self.path / 'results.jsonl'}"
        self.index: list[LineSummary] = [summary_model(e, where, fields) for e in entries]
        # where each latest line is in results.jsonl, and the seal it carries: its offset and length
        self._at: dict[tuple[str, int], dict] = {(e["sample_id"], int(e["trial"])): position(e) for e in entries}

    @property
    def lines(self) -> Lines:
        return Lines(self.path / "results.jsonl", list(self._at.values()))

    def seals(self) -> dict[tuple[str, int], str]:
        """The seal (``line_sha256``) of each latest line by (sample_id, trial): what a grade or a probe's row computed
        from that line names as its source (``source_sha256``)."""
        return {k: e[SEAL_KEY] for k, e in self._at.items() if e.get(SEAL_KEY)}

    def full(self, line: LineSummary) -> ResultLine:
        """The whole line (events and messages) of a summary or a line."""
        if isinstance(line, ResultLine):
            return line
        return Lines(self.path / "results.jsonl", [self._position(line)])[0]

    def recorded(self, line: LineSummary) -> dict:
        """The whole line exactly as the file holds it (its JSON, seal included): for a writer that copies recorded
        events and messages into a new line (a replay's prefix), byte for byte; every reader reads :meth:`full`."""
        return raw_line(self.path / "results.jsonl", self._position(line))

    def _position(self, line: LineSummary) -> dict:
        at = self._at.get(line.key)
        if at is None:
            raise RunError(f"{line.sample_id} trial {line.trial}: not a line of {self.path}")
        return at

    def tokens_path(self, line: LineSummary) -> Path | None:
        """The line's token sidecar, checked to lie inside the run directory (None when it recorded no tokens)."""
        if not line.tokens_file:
            return None
        return inside(self.path, line.tokens_file, f"{self.path / 'results.jsonl'} ({line.sample_id} "
                                                   f"trial {line.trial}): tokens_file")

    def tokens(self, line: LineSummary, columns: list[str] | None = None) -> dict[str, np.ndarray]:
        """The line's per-token arrays (``columns`` to read only some: the sidecar is columnar), from the sidecar
        whose bytes the line was written with (``tokens_sha256``)."""
        p = self.tokens_path(line)
        if p is None:
            return {}
        try:
            return _decode_sidecar(p, columns, sha256=line.tokens_sha256)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e}); python -m agent.rundir check {self.path}") from None

    def token_table(self, line: LineSummary, columns: list[str] | None = None, *, filters=None):
        """The line's sidecar as an Arrow table, as stored (checked as :meth:`tokens` is; ``columns`` and pyarrow
        row ``filters`` to read only some); None without one."""
        p = self.tokens_path(line)
        if p is None:
            return None
        try:
            return read_sidecar(p, columns, sha256=line.tokens_sha256, filters=filters)
        except (OSError, ValueError) as e:
            raise RunError(f"{p}: unreadable token sidecar ({e}); python -m agent.rundir check {self.path}") from None

    def prompt_pieces(self, line: LineSummary) -> tuple[str | None, dict]:
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

    def call_event(self, line: LineSummary, call: int | LlmCall) -> LlmCall:
        """The ``llm_call`` event of ``call``: the event itself, or its 1-based call index."""
        if isinstance(call, LlmCall):
            return call
        for ev in self.full(line).events:
            if isinstance(ev, LlmCall) and ev.index == call:
                return ev
        raise RunError(f"{line.sample_id} trial {line.trial}: no LLM call #{call} (it made {line.n_calls})")

    def call_messages(self, line: LineSummary, call: int | LlmCall) -> list[Message]:
        """The exact messages of one call (the event, or its 1-based index)."""
        whole = self.full(line)
        return [whole.messages[i] for i in self.call_event(whole, call).message_ids]

    def sendable_messages(self, line: LineSummary, call: int | LlmCall) -> list[dict]:
        """The call's messages ready to send again (the wire's dicts, as recorded): each recorded image part points
        at the stored image."""
        out = []
        for m in self.call_messages(line, call):
            msg = m.model_dump(exclude_unset=True)
            if isinstance(m.content, list):
                msg["content"] = [self._sendable(p, line) for p in m.content]
            out.append(msg)
        return out

    def _sendable(self, part, line: LineSummary) -> dict:
        if not isinstance(part, ImagePart):
            return part.model_dump(exclude_unset=True)
        if part.url:
            return {"type": "image_url", "image_url": {"url": part.url}}
        path = self.image_path(part.sha256) if part.sha256 else None
        if path is None or part.sha256 is None:
            raise RunError(f"{self.path}/images: image {(part.sha256 or '?')[:12]}… of {line.sample_id} is not stored "
                           f"(was the run directory copied without images/?)")
        # the hash rides along: removing query images never needs to read the file again
        return {"type": "image_url", "image_url": {"url": str(path)}, "sha256": part.sha256}

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


def load_run(path, fields=None) -> Run:
    """The run at ``path``; ``fields``: keep only these fields of each line's summary in ``run.index`` (its key and
    seal always kept; no field holding records of its own, such as ``calls``), for readers of thousands of lines
    that need a few of them: a few hundred bytes a line rather than its summary."""
    header = read_header(path)[1]
    listing = RunIndex(path)
    keep = None if fields is None else plain_fields(fields)
    project = None if keep is None else (lambda e: {k: e[k] for k in keep if k in e})
    run = Run(listing.path, header, list(listing.latest(project).values()), keep)  # whole lines read on access
    run.changed = list(listing.changed)  # lines left out: changed since they were written (warned by the index)
    return run
