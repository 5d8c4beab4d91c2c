"""``python -m agent.rundir export RUN OUT``: a run as plain Parquet tables with a dataset card.

    OUT/results.parquet   one row per result line   (agent.rundir.frames.results)
    OUT/steps.parquet     one row per LLM call      (agent.rundir.frames.steps)
    OUT/tokens.parquet    one row per generated token, keyed by sample_id and trial (the sidecars' columns)
    OUT/grades.parquet    one row per graded (sample, trial), when the run was judged
    OUT/README.md         the dataset card: what produced the run (model, server facts, protocol, sampling)

Every file opens as it is in pandas, polars, duckdb and ``datasets.load_dataset("parquet", data_files=...)``;
the card's YAML header names each table as a configuration, so ``load_dataset(OUT, "results")`` works too.
Tokens are written one result line at a time (memory stays flat as runs grow). OUT is written under a temporary
name and renamed into place: an interrupted export leaves no partial OUT.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..cli import done
from . import frames
from .common import RunError
from .grades import BrokenGrades
from .reader import load_run
from .sidecar import UNLOAD_COLUMNS

log = logging.getLogger(__name__)

__all__ = ["export_run", "export_command"]

_SPLIT = ["id", "logprob", "top_ids.list.element", "top_logprobs.list.element", "exact_entropy"]


def _line_tokens(run, line) -> pa.Table | None:
    """A line's sidecar as stored, keyed by sample_id and trial."""
    t = run.token_table(line)
    if t is None:
        return None
    n = t.num_rows
    t = t.replace_schema_metadata(None)
    t = t.add_column(0, "trial", pa.array([line.trial] * n, pa.int32()))
    return t.add_column(0, "sample_id", pa.array([line.sample_id] * n, pa.string()))


def _write_tokens(run, path: Path) -> int:
    """Every line's tokens into one file, a row group per line; the release columns when the run released images
    adaptively (its header's policy)."""
    writer: pq.ParquetWriter | None = None
    schema: pa.Schema | None = None
    rows = 0
    has_release = bool((run.header.image_unload or {}).get("policy"))
    try:
        for line in run.index:
            t = _line_tokens(run, line)
            if t is None or not t.num_rows:
                continue
            if writer is None or schema is None:
                schema = pa.schema([f for f in t.schema if f.name not in UNLOAD_COLUMNS]
                                   + ([pa.field(c, pa.float32()) for c in UNLOAD_COLUMNS] if has_release else []))
                writer = pq.ParquetWriter(path, schema, compression="zstd", compression_level=3,
                                          use_byte_stream_split=_SPLIT, use_dictionary=["sample_id", "text"])
            for f in schema:
                if f.name not in t.column_names:
                    t = t.append_column(f.name, pa.nulls(t.num_rows, f.type))
            writer.write_table(t.select(schema.names).cast(schema))
            rows += t.num_rows
    finally:
        if writer is not None:
            writer.close()
    return rows


def _card(run, counts: dict) -> str:
    h = run.header.as_recorded()  # the card shows what the header holds
    facts = {"method": h.get("label") or h.get("method"), "protocol": h.get("protocol", "paper"),
             "benchmark": h.get("benchmark"), "model": h.get("model"), "server": (h.get("model") or {}).get("server"),
             "sampling": h.get("sampling"), "logprobs": h.get("logprobs"), "budgets": h.get("budgets"),
             "trials": h.get("trials"), "versions": h.get("versions"), "created": h.get("created")}
    configs = "".join(f"- config_name: {name}\n  data_files: {name}.parquet\n" for name in counts)
    rows = "\n".join(f"| `{name}.parquet` | {n:,} | {what} |" for name, (n, what) in counts.items())
    return f"""---
configs:
{configs}---

# {Path(run.path).name}: a run of mmcf-toolkit

Exported with `python -m agent.rundir export` from the run directory `{Path(run.path).name}`.

| file | rows | one row per |
|---|---|---|
{rows}

Columns: docs/frames.md of mmcf-toolkit (tokens: docs/trajectory.md, "tokens/<key>.parquet").

## What produced it

```json
{json.dumps(facts, indent=1, sort_keys=True, default=str)}
```
"""


def export_run(run_dir, out) -> dict:
    """Write the run's tables and card into ``out`` (which must not exist); returns {table: rows}."""
    out = Path(out)
    if out.exists():
        raise RunError(f"{out} exists; give a new directory (an export never overwrites)")
    run = load_run(run_dir)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        res, st = frames.results(run), frames.steps(run)
        res.to_parquet(tmp / "results.parquet", index=False)
        st.to_parquet(tmp / "steps.parquet", index=False)
        counts = {"results": (len(res), "result line: a (sample, trial)"), "steps": (len(st), "LLM call")}
        n_tok = _write_tokens(run, tmp / "tokens.parquet")
        if n_tok:
            counts["tokens"] = (n_tok, "generated token")
        try:
            g = frames.grades(run)
        except BrokenGrades:
            raise
        except RunError:
            g = None
        if g is not None:
            g.to_parquet(tmp / "grades.parquet", index=False)
            counts["grades"] = (len(g), "graded (sample, trial): the latest grade")
        (tmp / "README.md").write_text(_card(run, counts))
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {k: n for k, (n, _) in counts.items()}


def export_command(a) -> int:
    """``python -m agent.rundir export`` once its arguments parse (agent/rundir/cli.py holds its flags)."""
    try:
        counts = export_run(a.run_dir, a.out)
    except RunError as e:
        log.error(f"error: {e}")
        return 2
    print(f"{a.run_dir} -> {a.out}: " + ", ".join(f"{k} {n:,} rows" for k, n in counts.items()))
    done([f"{a.out}/{k}.parquet" for k in counts] + [f"{a.out}/README.md"],
         f"python -c \"import pandas as pd; print(pd.read_parquet('{a.out}/results.parquet'))\"")
    return 0
