"""Shards of one run (agent.run --shard I/N) and their merge (agent.rundir merge): the same units, the same Table 1
and the same probe outputs as one run of the same command; every inconsistent or incomplete set is refused
before anything is written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from agent.judge import main as judge_main
from agent.run import main as run_main
from agent.rundir import check_run, load_run
from agent.rundir.cli import main as rundir_main
from agent.rundir.lines import seal
from agent.rundir.shards import shard_units
from probes.entropy import main as entropy_main

REPO = Path(__file__).resolve().parents[1]
BASE = ["--method", "react", "--backend", "scripted", "--limit", "5", "--trials", "2", "--seed", "7", "--no-progress"]


def unit_outcomes(run_dir) -> dict:
    """Each unit's outcome, as the tables and probes read it (timings, sidecar names and cache-hit flags aside:
    in one run, trial 1 finds trial 0's tool results in the cache; in two shards it may not)."""
    r = load_run(run_dir)
    out = {}
    for s in r.index:
        ln = r.full(s).as_recorded()
        calls = [(e.get("index"), e.get("n_tokens"), e.get("finish_reason")) for e in ln["events"] if e["type"] == "llm_call"]
        tools = [(e.get("tool"), e.get("observation")) for e in ln["events"] if e["type"] == "tool_call"]
        out[(ln["sample_id"], ln["trial"])] = (ln["status"], ln.get("answer"), ln.get("responses_sha"), calls, tools)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    # same-length directory names: the scripted model's prompt length counts the image paths' characters
    assert run_main(BASE + ["--out", str(d / "one")]) == 0
    for i in range(3):
        assert run_main(BASE + ["--shard", f"{i}/3", "--out", str(d / f"sh{i}")]) == 0
    assert rundir_main(["merge", str(d / "mrg"), *(str(d / f"sh{i}") for i in (2, 0, 1))]) == 0
    return d


def test_the_shards_are_a_balanced_partition_of_the_units(runs):
    parts = [set(unit_outcomes(runs / f"sh{i}")) for i in range(3)]
    assert sorted(len(p) for p in parts) == [3, 3, 4]  # 10 units over 3 shards
    assert not (parts[0] & parts[1]) and not (parts[1] & parts[2]) and not (parts[0] & parts[2])
    assert set().union(*parts) == set(unit_outcomes(runs / "one"))
    # a pure function of the ordered unit list
    units = [(f"s{j}", t) for t in range(2) for j in range(5)]
    assert shard_units(units, 1, 3) == [units[1], units[4], units[7]]
    h = json.loads((runs / "sh1" / "header.json").read_text())["shard"]
    assert h["index"] == 1 and h["of"] == 3 and h["units"] == 3 and h["all_units"] == 10
    # each shard's own check expects its part only
    rep = check_run(runs / "sh1")
    assert rep.intact and rep.complete and rep.expected == 3


@pytest.mark.slow
def test_the_merged_run_is_one_run(runs, capsys):
    one, mrg = runs / "one", runs / "mrg"
    assert unit_outcomes(mrg) == unit_outcomes(one)
    rep = check_run(mrg)
    assert rep.intact and rep.complete and rep.expected == 10 and rep.present == 10 and not rep.orphans, rep.lines()
    h = json.loads((mrg / "header.json").read_text())
    assert "shard" not in h and [m["index"] for m in h["merged_from"]] == [0, 1, 2]
    assert h["sampling"] == json.loads((one / "header.json").read_text())["sampling"]
    # one tool cache, the union of the shards'
    import sqlite3

    keys = lambda p: {r[0] for r in sqlite3.connect(p).execute("SELECT key FROM tool_cache")}  # noqa: E731
    assert keys(mrg / "tools.sqlite") == set().union(*(keys(runs / f"sh{i}" / "tools.sqlite") for i in range(3)))
    assert keys(mrg / "tools.sqlite") == keys(one / "tools.sqlite")
    # sidecars and images all there (check_run verified the sidecars against their calls)
    assert {p.name for p in (mrg / "images").iterdir()} == {p.name for p in (one / "images").iterdir()}
    # the same Table 1 ...
    for r in (one, mrg):
        assert judge_main([str(r), "--judge", "exact", "--no-progress"]) == 0
    assert (one / "table1-exact.csv").read_text() == (mrg / "table1-exact.csv").read_text()
    # ... and the same entropy probe
    steps = []
    for r in (one, mrg):
        assert entropy_main([str(r), "--backend", "scripted", "--no-progress"]) == 0
        # each run names its own lines' seals (their sidecars' names differ): all else is equal
        s = pd.read_csv(r / "probes" / "entropy-regenerate" / "steps.csv").drop(columns=["latency_s", "source_sha256"])
        steps.append(s.sort_values(["sample_id", "trial", "step"]).reset_index(drop=True))
    assert len(steps[0]) > 10
    pd.testing.assert_frame_equal(steps[0], steps[1])
    # and the merged run resumes as one run: nothing left to do
    assert run_main(BASE + ["--out", str(mrg)]) == 0
    assert "10 already done, 0 to run" in capsys.readouterr().err


def test_merge_refuses_what_is_not_one_complete_run(runs, tmp_path, capsys):
    sh = [str(runs / f"sh{i}") for i in range(3)]

    def refused(args, *needles):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        assert rundir_main(["merge", str(out), *args]) == 2
        err = capsys.readouterr().err
        for n in needles:
            assert n in err, err
        assert not out.exists()  # refused before writing anything

    refused(sh[:2], "1 of the 3 shards are not given", "[2]")
    refused([sh[0], sh[0], sh[1], sh[2]], "shard index 0 of 3 given twice")
    refused([str(runs / "one"), *sh], "not a shard")
    # another sampling setting is another run
    other = tmp_path / "t2"
    assert run_main(BASE[:-3] + ["--seed", "7", "--temperature", "0.5", "--no-progress", "--shard", "2/3",
                                 "--out", str(other)]) == 0
    refused([sh[0], sh[1], str(other)], "not a shard of the same run", "sampling")
    # another unit list (another --limit) is refused as such
    lim = tmp_path / "lim"
    assert run_main([*BASE[:2], *BASE[2:4], "--limit", "4", *BASE[6:], "--shard", "2/3", "--out", str(lim)]) == 0
    refused([sh[0], sh[1], str(lim)], "not a shard of the same run")
    # an incomplete shard: what is missing is said, and nothing is written
    part = tmp_path / "part"
    shutil.copytree(sh[2], part)
    lines = (part / "results.jsonl").read_bytes().splitlines(keepends=True)
    (part / "results.jsonl").write_bytes(lines[0])
    (part / "results.index.jsonl").unlink()
    refused([sh[0], sh[1], str(part)], "incomplete shards", f"{part}: 2 unit(s) missing", "Rerun")
    # rerunning the shard's own command completes it, and then the merge goes through
    assert run_main(BASE + ["--shard", "2/3", "--out", str(part)]) == 0
    assert "1 already done, 2 to run" in capsys.readouterr().err
    # a merge that failed half-way left only its own working directory, which the next merge replaces
    (tmp_path / ".ok.merging").mkdir()
    (tmp_path / ".ok.merging" / "results.jsonl").write_text('{"torn')
    assert rundir_main(["merge", str(tmp_path / "ok"), sh[0], sh[1], str(part)]) == 0
    assert not (tmp_path / ".ok.merging").exists() and "merge: 10/10 units written" in capsys.readouterr().err
    assert unit_outcomes(tmp_path / "ok") == unit_outcomes(runs / "one")
    # a shard whose tool cache is gone still merges (its lines hold the observations), and says so
    nocache = tmp_path / "nocache"
    shutil.copytree(sh[2], nocache)
    (nocache / "tools.sqlite").unlink()
    assert rundir_main(["merge", str(tmp_path / "nc"), sh[0], sh[1], str(nocache)]) == 0
    assert "no tool cache found for 1 shard" in capsys.readouterr().err
    assert json.loads((tmp_path / "nc" / "merge.json").read_text())["shards_without_tool_cache"] == [str(nocache)]
    # a merge into an existing run directory is refused
    assert rundir_main(["merge", str(runs / "one"), *sh]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_shard_arguments_are_checked_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_main(BASE + ["--shard", "3/3", "--out", str(tmp_path / "x")])
    assert "0 <= I < N" in capsys.readouterr().err
    no_seed = [a for a in BASE if a not in ("--seed", "7")]
    assert run_main(no_seed + ["--shard", "0/2", "--out", str(tmp_path / "y")]) == 2
    assert "needs --seed" in capsys.readouterr().err and not (tmp_path / "y" / "results.jsonl").exists()
    # a shard directory resumed as another shard is another run
    assert run_main(BASE + ["--shard", "0/2", "--out", str(tmp_path / "z")]) == 0
    assert run_main(BASE + ["--shard", "1/2", "--out", str(tmp_path / "z")]) == 2
    assert "holds a different run" in capsys.readouterr().err


@pytest.mark.slow
def test_the_slurm_example_runs_one_shard_per_array_task(tmp_path):
    """scripts/slurm_array.sh as Slurm would run it (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT set), on the
    offline demo; the merge of its two tasks is the whole run."""
    out = tmp_path / "runs" / "react-demo"
    env = {**os.environ, "BACKEND": "scripted", "OUT": str(out), "TRIALS": "1", "SEED": "3", "EXTRA": "--limit 4",
           "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_SUBMIT_DIR": str(REPO), "PYTHONPATH": str(REPO),
           "PYTHON": sys.executable}
    for i in (0, 1):
        r = subprocess.run(["bash", str(REPO / "scripts" / "slurm_array.sh")], env={**env, "SLURM_ARRAY_TASK_ID": str(i)},
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        assert json.loads((Path(f"{out}.shard-{i}") / "header.json").read_text())["shard"]["of"] == 2
    r = subprocess.run([sys.executable, "-m", "agent.rundir", "merge", str(out), f"{out}.shard-0", f"{out}.shard-1"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    rep = check_run(out)
    assert rep.intact and rep.complete and len(load_run(out).index) == 4


def test_one_task_resubmitted_without_the_arrays_size_is_refused_saying_how(tmp_path):
    """``sbatch --array=3`` alone counts an array of 1: the script says to give SHARDS (tests/test_slurm.py runs
    the resubmission under a real Slurm)."""
    env = {**os.environ, "BACKEND": "scripted", "OUT": str(tmp_path / "r"), "SLURM_ARRAY_TASK_ID": "3",
           "SLURM_ARRAY_TASK_COUNT": "1", "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "scripts" / "slurm_array.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "task 3 of an array of 1" in r.stderr and "SHARDS=" in r.stderr
    assert not (tmp_path / "r.shard-3").exists()


def _point_tokens_file(run_dir: Path, name: str) -> None:
    """A hostile edit: the first line's ``tokens_file`` set to ``name`` and sealed again, as a crafted run would be
    (the index dropped, so it is read again)."""
    res = run_dir / "results.jsonl"
    lines = res.read_bytes().splitlines()
    first = json.loads(lines[0])
    first["tokens_file"] = name
    res.write_bytes(b"\n".join([seal(first), *lines[1:]]) + b"\n")
    (run_dir / "results.index.jsonl").unlink(missing_ok=True)


@pytest.mark.parametrize("name", ["../victim.txt", "/etc/hostname", "tokens/../../victim.txt", "tokens/link.parquet"])
def test_merge_check_and_readers_refuse_a_sidecar_name_that_leads_out_of_the_run(runs, tmp_path, capsys, name):
    from agent.rundir import RunError

    shards = [tmp_path / f"sh{i}" for i in range(3)]
    for i, d in enumerate(shards):
        shutil.copytree(runs / f"sh{i}", d)
    victim = tmp_path / "victim.txt"  # what ../victim.txt names from inside sh0
    victim.write_text("not a sidecar")
    target = tmp_path / "out" / "victim.txt"
    (shards[0] / "tokens" / "link.parquet").symlink_to(victim)  # a symlink inside, pointing out
    _point_tokens_file(shards[0], name)
    capsys.readouterr()
    assert rundir_main(["merge", str(tmp_path / "out"), *map(str, shards)]) != 0
    err = capsys.readouterr().err
    assert "leads outside" in err and "results.jsonl" in err and name in err
    assert not (tmp_path / "out").exists() and not target.exists() and victim.read_text() == "not a sidecar"
    rep = check_run(shards[0])
    assert not rep.intact and any("leads outside" in p for _, p in rep.sidecars)
    run = load_run(shards[0])
    with pytest.raises(RunError, match="leads outside"):
        run.tokens(run.full(run.index[0]))


def _viewer_text(index) -> str:
    """The viewer's index page and every trajectory page beside it (agent.show --html)."""
    from agent.show import files_dir

    return index.read_text() + "".join(p.read_text() for p in sorted(files_dir(index).glob("*.html")))


def test_a_stored_image_that_links_out_of_the_run_is_refused_by_check_and_never_embedded(runs, tmp_path, capsys):
    import base64

    from agent.show import main as show_main

    run_dir = tmp_path / "run"
    shutil.copytree(runs / "one", run_dir)
    stored = sorted((run_dir / "images").iterdir())[0]
    as_embedded = base64.b64encode(stored.read_bytes()).decode()
    assert show_main([str(run_dir), "--html", str(tmp_path / "before.html")]) == 0
    assert as_embedded in _viewer_text(tmp_path / "before.html")  # the stored image is embedded as it is
    secret = tmp_path / "secret.png"  # the same bytes, outside the run, reached through a symlink inside it
    shutil.copyfile(stored, secret)
    stored.unlink()
    stored.symlink_to(secret)
    rep = check_run(run_dir)
    assert not rep.intact and any("leads outside" in p for _, p in rep.sidecars)
    capsys.readouterr()
    assert show_main([str(run_dir), "--html", str(tmp_path / "after.html")]) == 0
    assert as_embedded not in _viewer_text(tmp_path / "after.html")
    assert "leads outside" in capsys.readouterr().err


def test_a_second_merge_into_the_same_out_is_refused_while_the_first_runs(runs, tmp_path, capsys):
    """C1: the lock beside OUT; held here as a running merge holds it."""
    from agent.rundir import output_lock

    shards = [str(runs / f"sh{i}") for i in range(3)]
    with output_lock(tmp_path, "merge into out", ".out.merge.lock"):
        assert rundir_main(["merge", str(tmp_path / "out"), *shards]) != 0
        assert "another merge into out is writing here" in capsys.readouterr().err
        assert not (tmp_path / "out").exists() and not (tmp_path / ".out.merging").exists()
    assert rundir_main(["merge", str(tmp_path / "out"), *shards]) == 0  # once it is released, the merge runs


@pytest.mark.parametrize("damage", ["truncated sidecar", "missing image"])
def test_merge_refuses_a_damaged_shard_naming_the_file(runs, tmp_path, capsys, damage):
    """M1: a shard whose sidecar was cut short or whose image is gone is refused before anything is written."""
    shards = [tmp_path / f"sh{i}" for i in range(3)]
    for i, d in enumerate(shards):
        shutil.copytree(runs / f"sh{i}", d)
    if damage == "truncated sidecar":
        victim = sorted((shards[1] / "tokens").glob("*.parquet"))[0]
        victim.write_bytes(victim.read_bytes()[:-100])
        named = victim.name
    else:
        victim = sorted((shards[1] / "images").iterdir())[0]
        victim.unlink()
        named = "is not stored"
    capsys.readouterr()
    assert rundir_main(["merge", str(tmp_path / "out"), *map(str, shards)]) != 0
    err = capsys.readouterr().err
    assert f"{shards[1]} is damaged" in err and named in err and "python -m agent.rundir check" in err
    assert not (tmp_path / "out").exists()


def test_a_merge_is_whole_or_absent_and_its_rerun_finishes(runs, tmp_path, capsys):
    """K2: the ledger and the completion marker (merge.json, last) are written before the one rename: OUT is either
    absent or whole; rerunning the same merge after it finished says so and exits 0."""
    shards = [str(runs / f"sh{i}") for i in range(3)]
    out = tmp_path / "out"
    assert rundir_main(["merge", str(out), *shards]) == 0
    led = json.loads((out / "ledger.json").read_text())
    assert led["run_dir"] == str(out) and led["units"] == 10
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    assert rundir_main(["merge", str(out), *shards]) == 0  # the same command again: nothing to do, nothing changed
    assert "already merged from these 3 shards" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert rundir_main(["merge", str(out), *shards[:2], str(runs / "sh2")]) == 0  # the same shards named otherwise
    assert rundir_main(["merge", str(out), str(runs / "sh0"), str(runs / "sh1")]) != 0  # not these shards: refused
