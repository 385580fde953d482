"""report.py and plot_curves.py on hand-written run directories: which runs count as
finished, the default target by data source, and what the plot shows and where it goes."""

import json
from pathlib import Path

import pytest
import yaml
from matplotlib.colors import to_hex

from scripts import plot_curves, report
from scripts.runs import find_runs

SAMPLE = {"source": "sample"}
FINEWEB = {"source": "shards", "dir": "~/.cache/gpt-speedrun/fineweb10B",
           "train_files": "fineweb_train_*.bin"}  # fmt: skip


def write_run(
    root: Path,
    name: str,
    losses: list[float],
    *,
    steps: int | None = None,
    overrides: tuple[str, ...] = ("seed=0",),
    data: dict | None = None,
    hydra: bool = True,
    done_log: bool = False,
    target_reached: bool = False,
    config: dict | None = None,
) -> Path:
    """A run that evaluated at steps 0, 1, 2, ... with `losses`; planned `steps` (default:
    as many as it logged, i.e. finished)."""
    run = root / name
    run.mkdir(parents=True)
    records = [{"step": 0, "val_loss": losses[0], "tokens": 0, "train_time_ms": 0.0}]
    for step, loss in enumerate(losses[1:], 1):
        records.append({"step": step, "train_loss": loss + 0.1, "val_loss": loss,
                        "tokens": step * 64, "train_time_ms": step * 500.0})  # fmt: skip
    if target_reached:
        records[-1]["target_reached"] = True
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if hydra:
        planned = len(losses) - 1 if steps is None else steps
        extra = config or {}
        config = {"train": {"steps": planned, **extra.get("train", {})}, "data": data or SAMPLE,
                  "seed": 0}  # fmt: skip
        (run / ".hydra").mkdir()
        (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    last = "done: 2 steps, 128 tokens, final val loss 7.0" if done_log else "step 1/8 loss 9.0"
    (run / "train.log").write_text(f"starting\n{last}\n")
    return run


def test_a_run_is_finished_at_its_planned_steps_or_its_target(tmp_path: Path) -> None:
    full = write_run(tmp_path, "full", [10.0, 8.0, 7.0])
    early = write_run(tmp_path, "early", [10.0, 8.0, 7.5, 7.2], steps=8)
    target = write_run(tmp_path, "target", [10.0, 8.0], steps=8, target_reached=True)
    only_step0 = write_run(tmp_path, "step0", [10.0], steps=8)
    logged = write_run(tmp_path, "logged", [10.0, 8.0], hydra=False, done_log=True)
    bare = write_run(tmp_path, "bare", [10.0, 8.0], hydra=False)
    why = {Path(r.name).name: report.unfinished_reason(r) for r in find_runs([tmp_path])}
    assert why["full"] is None and why["target"] is None and why["logged"] is None
    assert why["early"] == "last validation at step 3 of 8"
    assert why["step0"] == "last validation at step 0 of 8"
    assert why["bare"] == (
        "planned steps unknown: no .hydra/config.yaml and train.log does not end in 'done:' "
        "(last validation at step 1, records reach step 1)"
    )
    finished, unfinished = report.split_finished(find_runs([full, early, target, only_step0]))
    assert [r.name for r in finished] == [str(full), str(target)]
    assert [r.name for r, _ in unfinished] == [str(early), str(only_step0)]
    assert {logged.name, bare.name} <= set(why)


def test_report_skips_unfinished_runs_and_says_which(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    sweep = tmp_path / "sweep"
    write_run(sweep, "0", [10.0, 7.0, 6.0], overrides=("seed=0",))
    write_run(sweep, "1", [10.0, 7.2, 6.2], overrides=("seed=1",))
    write_run(sweep, "2", [10.0, 9.0, 8.5, 8.0], steps=8, overrides=("seed=2",))
    write_run(sweep, "3", [10.0], steps=8, overrides=("seed=3",))
    assert report.main([str(sweep), "--target", "6.5"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "skipped 2 unfinished runs, not in the statistics:",
        f"  {sweep / '2'}: last validation at step 3 of 8",
        f"  {sweep / '3'}: last validation at step 0 of 8",
    ]
    assert "| all runs | 2 | 6.1000 |" in out, "the unfinished runs' losses are not pooled"
    write_run(tmp_path / "one", "0", [10.0, 9.0], steps=8)
    assert "skipped 1 unfinished run, " in report.skipped_note(report.split_finished(
        find_runs([tmp_path / "one"]))[1])  # fmt: skip


def test_report_fails_when_no_run_finished(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path, "0", [10.0, 9.0], steps=8)
    write_run(tmp_path, "1", [10.0], steps=8, overrides=("seed=1",))
    assert report.main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("skipped 2 unfinished runs, not in the statistics:\n")
    assert err.splitlines()[-1] == "no finished runs to report: every run stopped early"


def write_job(root: Path, name: str, records: list[dict] | None, steps: int, seed: int) -> Path:
    """A Hydra job directory as a sweep leaves it: `records` as metrics.jsonl (None: the job
    stopped before its first record), its config planning `steps` and its overrides."""
    job = root / name
    (job / ".hydra").mkdir(parents=True)
    config = {"train": {"steps": steps, "val_seq_len": "${min:1,2}"}, "data": SAMPLE, "seed": seed}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"seed={seed}"]))
    if records is not None:
        (job / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return job


def trained(step: int, val_loss: float | None = None) -> dict:
    """The loop's record of `step`, with the validation loss when an evaluation finished."""
    rec = {"step": step, "train_loss": 10.8, "tokens": 128 * step, "train_time_ms": 500.0 * step}
    return rec if val_loss is None else rec | {"val_loss": val_loss}


START = {"step": 0, "tokens": 0, "train_time_ms": 0.0, "val_loss": 10.8258}


def test_a_job_stopped_in_its_last_step_is_not_pooled(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A job stopped during step 2 of 2 logs step 2 without a val loss; counting it pooled its
    step-0 loss: n = 2, mean (10.5232 + 10.8258) / 2 = 10.6745."""
    sweep = tmp_path / "sweep"
    write_job(sweep, "0", [START, trained(1), trained(2, 10.5232)], steps=2, seed=0)
    stopped = write_job(sweep, "1", [START, trained(1), trained(2)], steps=2, seed=1)
    assert report.main([str(sweep), "--target", "10.6", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[1].startswith("all runs,1,10.5232,,10.5232,1,1.0,,")
    assert err.splitlines() == [
        "skipped 1 unfinished run, not in the statistics:",
        f"  {stopped}: last validation at step 0 of 2; step 2 ran but its validation did not "
        "finish",
    ]


def test_why_a_run_is_unfinished(tmp_path: Path) -> None:
    write_job(tmp_path, "0", None, steps=2, seed=0)
    write_job(tmp_path, "1", [], steps=2, seed=1)
    write_job(tmp_path, "2", [trained(1), trained(2)], steps=2, seed=2)
    write_job(tmp_path, "3", [START, trained(1), trained(2, 10.6), trained(3)], steps=8, seed=3)
    write_job(tmp_path, "4", [START, trained(1, 10.7)], steps=8, seed=4)
    cut = write_job(tmp_path, "5", [START, trained(1, 10.7), trained(2, 10.6)], steps=2, seed=5)
    (cut / "metrics.jsonl").write_text((cut / "metrics.jsonl").read_text()[:-9])
    why = [why for _, why in report.split_finished(find_runs([tmp_path]))[1]]
    assert why == [
        "no metrics.jsonl",
        "metrics.jsonl is empty",
        "no validation loss (the records reach step 2)",
        "last validation at step 2 of 8; the records stop at step 3",
        "last validation at step 1 of 8",
        "metrics.jsonl line 3 is not JSON (Unterminated string starting at)",
    ]
    assert find_runs([cut])[0].final_val_loss() == 10.7, "the lines before a cut one still read"


def test_overrides_read_as_hydra_reads_them(tmp_path: Path) -> None:
    """Hydra's parser: `1e-2` and `0.01` are one learning rate, `+k=v` sets `k`."""
    for name, lr in (("0", "1e-2"), ("1", "0.01")):
        run = write_run(tmp_path, name, [10.0, 7.0], overrides=(f"+optim.muon.lr={lr}",
                        f"seed={name}", "data.train_files='a b'"))  # fmt: skip
    assert find_runs([run])[0].overrides == {
        "optim.muon.lr": "0.01", "seed": "1", "data.train_files": "'a b'"
    }  # fmt: skip
    assert [r["group"] for r in report.summarize(find_runs([tmp_path]), None)] == ["all runs"]


def test_no_record_target_by_default_off_fineweb(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    write_run(tmp_path / "sample", "0", [10.0, 3.0, 2.9], data=SAMPLE)
    assert report.main([str(tmp_path / "sample"), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        "no target test: 3.28 is a FineWeb val loss and these runs train on sample; "
        "give --target to test against one"
    ]
    assert out.splitlines()[1] == "all runs,1,2.9,,2.9,,,,", "target columns empty"
    # An explicit target is used as given, without the note.
    assert report.main([str(tmp_path / "sample"), "--target", "3.0", "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.splitlines()[1].startswith("all runs,1,2.9,,2.9,1,0.5,,")
    # On FineWeb the record target is the default.
    write_run(tmp_path / "fw", "0", [10.0, 3.3, 3.27], data=FINEWEB)
    assert report.main([str(tmp_path / "fw"), "--format", "csv"]) == 0
    out, err = capsys.readouterr()
    row = out.splitlines()[1].split(",")
    assert err == "" and row[5:8] == ["1", "1.0", ""] and float(row[8]) == pytest.approx(0.01)
    # A run of the GPT-2 Medium track aims at its own train.reference.target; mixed aims: none.
    medium = {"train": {"reference": {"target": 2.92}}}
    write_run(tmp_path / "m", "0", [10.0, 2.95, 2.91], data=FINEWEB, config=medium)
    assert report.default_target(find_runs([tmp_path / "m"])) == (2.92, None)
    target, why = report.default_target(find_runs([tmp_path / "m", tmp_path / "fw"]))
    assert target is None and "different targets ([2.92, 3.28]" in why
    # Other shards, or no config at all, are not FineWeb either.
    write_run(tmp_path / "local", "0", [10.0, 3.0], data={"source": "shards", "dir": "/d"})
    assert report.default_target(find_runs([tmp_path / "local"]))[1].endswith(
        "train on shards at /d; give --target to test against one"
    )
    write_run(tmp_path / "bare", "0", [10.0, 3.0], hydra=False, done_log=True)
    target, why = report.default_target(find_runs([tmp_path / "bare"]))
    assert target is None and "unknown (no .hydra/config.yaml)" in why


def test_plot_defaults_to_the_runs_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    write_run(sweep, "0", [10.0, 7.0, 6.0])
    write_run(sweep, "1", [10.0, 7.2, 6.2], overrides=("seed=1",))
    assert plot_curves.main(["sweep"]) == 0
    assert (sweep / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "curves.png").exists()
    assert (
        capsys.readouterr().out == f"wrote {sweep / 'curves.png'}: 2 run(s), 0 reference curve(s)\n"
    )
    # Two separate runs: their common parent; one run: its own directory.
    write_run(tmp_path / "outputs", "a", [10.0, 7.0])
    write_run(tmp_path / "outputs", "b", [10.0, 7.5])
    assert plot_curves.main(["outputs/a", "outputs/b"]) == 0
    assert (tmp_path / "outputs" / "curves.png").is_file()
    assert plot_curves.main(["outputs/a"]) == 0
    assert (tmp_path / "outputs" / "a" / "curves.png").is_file()


def test_plot_title_labels_and_integer_ticks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_run(tmp_path / "sweep", "0", [10.0, 7.0, 6.0])
    write_run(tmp_path / "sweep", "1", [10.0, 7.5, 6.5], overrides=("seed=1",))
    runs = find_runs(["sweep"])
    ax = plot_curves.plot(runs).axes[0]
    assert ax.get_title() == "validation loss vs step: sweep"
    assert ax.get_ylabel() == "validation loss" and ax.get_xlabel() == "step"
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    ax = plot_curves.plot(runs, x="tokens", train=True).axes[0]
    assert ax.get_title() == "validation and train loss vs tokens: sweep"
    assert "train" in ax.get_ylabel() and ax.get_xlabel() == "tokens"
    assert all(float(t).is_integer() for t in ax.get_xticks())
    assert plot_curves.plot(runs, title="mine").axes[0].get_title() == "mine"


def test_seeds_of_one_config_share_a_colour_and_a_legend_entry(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    for i, (lr, seed) in enumerate([("0.01", 0), ("0.01", 1), ("0.02", 0), ("0.02", 1)]):
        write_run(sweep, str(i), [10.0, 7.0 + i / 10, 6.0 + i / 10],
                  overrides=(f"optim.muon.lr={lr}", f"seed={seed}"))  # fmt: skip
    write_run(sweep, "4", [10.0, 8.0], steps=8, overrides=("optim.muon.lr=0.02", "seed=2"))
    ax = plot_curves.plot(find_runs([sweep])).axes[0]
    lines = ax.get_lines()
    assert len(lines) == 5, "one line per seed"
    colours = [to_hex(line.get_color()) for line in lines]
    assert colours[0] == colours[1] and colours[2] == colours[3] == colours[4]
    assert colours[0] != colours[2]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [
        "optim.muon.lr=0.01 val (2 seeds)",
        "optim.muon.lr=0.02 val (2 seeds)",
        "optim.muon.lr=0.02 seed=2 val (unfinished)",
    ]
    assert [line.get_linestyle() for line in lines] == ["-", "-", "-", "-", "--"]


def test_plot_says_which_runs_are_unfinished(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_run(tmp_path / "sweep", "0", [10.0, 7.0, 6.0])
    early = write_run(tmp_path / "sweep", "1", [10.0, 8.0], steps=8, overrides=("seed=1",))
    out = tmp_path / "x.png"
    assert plot_curves.main([str(tmp_path / "sweep"), "--out", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"unfinished (dashed): {early} (last validation at step 1 of 8)",
        f"wrote {out}: 2 run(s), 0 reference curve(s)",
    ]
    assert plot_curves.main([str(tmp_path / "sweep"), "--out", str(out), "--skip-unfinished"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"unfinished (left out): {early} (last validation at step 1 of 8)",
        f"wrote {out}: 1 run(s), 0 reference curve(s)",
    ]
