"""The pages agree with the config and with each other: a number or a list that more than one
page would need is written once and linked from the others, and these tests hold each source
to the config, data and code it comes from.

- The experiment presets are listed once, in README's preset table (every file of
  conf/experiment/), and every other group's presets in docs/config.md's group table.
- No page counts the record presets in words ("three presets") other than as conf/ has them,
  and no page lists some record presets where it means all of them.
- The preset table keeps this trainer's measurements and the records' own results in separate,
  named columns, and each record's time and loss are its reference curve's last row.
- The default run's step time on a CPU is stated once, in docs/benchmarks.md."""

import re
from pathlib import Path

import pytest

from trainer.reference import load_curve

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
STEP_TIME_PAGE = REPO / "docs" / "benchmarks.md"

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
RECORDS = [e for e in EXPERIMENTS if e.startswith("record_")]
GROUPS = sorted(
    d.name for d in CONF.iterdir() if d.is_dir() and d.name not in ("experiment", "hydra")
)
NUMBERS = ["one", "two", "three", "four", "five", "six"]
NUMBERS += ["seven", "eight", "nine", "ten", "eleven", "twelve"]


def name(page: Path) -> str:
    return str(page.relative_to(REPO))


def blocks(page: Path) -> list[tuple[int, str]]:
    """A page's paragraphs and tables as (first line number, text), outside code blocks and
    outside what a script renders into it (between `<!-- x:begin -->` and `<!-- x:end -->`:
    results, which list what ran)."""
    out: list[tuple[int, str]] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    start, chunk, fenced, rendered = 0, [], False, False
    for n, line in enumerate([*lines, ""], 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if re.fullmatch(r"<!-- [\w-]+:(begin|end) -->", line.strip()):
            rendered = line.strip().endswith(":begin -->")
            continue
        if fenced or rendered:
            continue
        if line.strip():
            start, chunk = (start or n), [*chunk, line]
        elif chunk:
            out.append((start, "\n".join(chunk)))
            start, chunk = 0, []
    return out


def cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def tables(page: Path) -> list[tuple[int, list[str], list[list[str]]]]:
    """Each Markdown table of a page: (line of its header, header cells, rows of cells)."""
    found = []
    for start, text in blocks(page):
        lines = text.splitlines()
        if len(lines) > 2 and all(x.startswith("|") for x in lines):
            found.append((start, cells(lines[0]), [cells(x) for x in lines[2:]]))
    return found


def section(page: Path, heading: str) -> str:
    text = page.read_text(encoding="utf-8")
    match = re.search(rf"^{re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{name(page)} has no section {heading!r}"
    return match.group(1)


def preset_table() -> tuple[list[str], list[list[str]]]:
    """README's preset table: the first table under '## Presets'."""
    rows = [x for x in section(README, "## Presets").splitlines() if x.startswith("|")]
    assert len(rows) > 2, "README.md's '## Presets' holds no table"
    return cells(rows[0]), [cells(x) for x in rows[2:]]


def column(header: list[str], words: str) -> int:
    hits = [i for i, h in enumerate(header) if words in h.lower()]
    assert len(hits) == 1, f"the preset table needs one column headed '{words}...': {header}"
    return hits[0]


def test_the_preset_table_lists_every_experiment_preset() -> None:
    _, rows = preset_table()
    listed = {n for row in rows for n in re.findall(r"`(?:experiment=)?(\w+)`", row[0])}
    missing = [e for e in EXPERIMENTS if e not in listed]
    assert not missing, f"README.md's preset table lacks {missing} (conf/experiment/)"
    unknown = {n for row in rows for n in re.findall(r"experiment=(\w+)", row[0])}
    assert unknown <= set(EXPERIMENTS), f"the preset table names {unknown - set(EXPERIMENTS)}"


def test_config_lists_every_other_groups_presets_and_links_the_experiments() -> None:
    """docs/config.md's group table: each group's presets (conf/<group>/*.yaml) in its row;
    the experiments' row points to README's preset table instead of repeating it."""
    page = REPO / "docs" / "config.md"
    [(_, _, rows)] = [t for t in tables(page) if t[1][:2] == ["group", "presets"]]
    row = {r[0].strip("`"): r[1] for r in rows}
    for group in GROUPS:
        presets = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        shown = set(re.findall(r"`(\w+)`", row.get(group, "")))
        assert set(presets) <= shown, f"docs/config.md's {group} row lacks {set(presets) - shown}"
    experiments = row.get("experiment", "")
    assert "../README.md#presets" in experiments, "docs/config.md: link the preset table"
    assert not re.findall(r"`(\w+)`", experiments), "docs/config.md repeats the preset list"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_no_page_counts_the_record_presets_otherwise(page: Path) -> None:
    """'three presets' goes stale when a record is added; a count in words must be conf's."""
    said = re.compile(
        rf"\b({'|'.join(NUMBERS)})\s+((?:record|public|NanoGPT|speedrun)\s+)*(presets|records)\b",
        re.I,
    )
    wrong = [
        f"{name(page)}:{start}: {m.group(0)!r}"
        for start, text in blocks(page)
        for m in said.finditer(text)
        if NUMBERS.index(m.group(1).lower()) + 1 != len(RECORDS)
    ]
    assert not wrong, f"conf/experiment/ has {len(RECORDS)} record presets: {wrong}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_a_list_of_record_presets_names_them_all(page: Path) -> None:
    """A paragraph or table that names three or more record presets is a list of them, and a
    list that lacks one has gone stale (a record was added after it was written)."""
    for start, text in blocks(page):
        named = {r for r in RECORDS if r in text}
        assert len(named) < 3 or named == set(RECORDS), (
            f"{name(page)}:{start} lists the record presets without {set(RECORDS) - named}"
        )


def test_the_preset_table_keeps_the_records_results_apart_from_this_trainers() -> None:
    """Two named columns; each record's time and loss are its reference curve's last row
    (the curve its conf/experiment file cites); this trainer's cell restates neither."""
    header, rows = preset_table()
    ours, theirs = column(header, "this trainer"), column(header, "record's own")
    for row in rows:
        preset = re.search(r"experiment=(\w+)", row[0])
        if not preset or not preset.group(1).startswith("record_"):
            assert not re.search(r"\d", row[theirs]), f"{row[0]} is no record: {row[theirs]}"
            continue
        cited = (CONF / "experiment" / f"{preset.group(1)}.yaml").read_text(encoding="utf-8")
        curve = load_curve(re.search(r"scripts/reference/([\w.-]+)\.csv", cited).group(1))
        loss, ms = curve.val_loss[-1], curve.train_time_ms[-1]
        assert f"{loss:.4f}" in row[theirs], f"{row[0]}: the record's loss is {loss:.4f}"
        value, unit = re.search(r"([\d.]+) (min|s)\b", row[theirs]).groups()
        decimals = len(value.partition(".")[2])
        assert round(ms / (60_000 if unit == "min" else 1000), decimals) == float(value), (
            f"{row[0]}: the record's train time is {ms:.0f} ms, not {value} {unit}"
        )
        assert row[ours] and f"{loss:.4f}" not in row[ours] and value not in row[ours], (
            f"{row[0]}: this trainer's cell must say what this trainer measured, or that it "
            f"has not: {row[ours]!r}"
        )


TIME = r"~?(\d[\d,]*(?:\.\d+)?) ?(?:ms|s)\b"
DEFAULT_ROW = re.compile(r"^(`python train\.py`(?: \(|$)|`tiny` \(default\)|.*\bthe default run\b)")
PER_STEP = re.compile(rf"{TIME}(?:/step| a step| per step)")
IN_WORDS = [PER_STEP, re.compile(rf"\bsteps? (?:from|took|takes) {TIME}(?: to {TIME})?")]


def default_step_times(page: Path) -> list[tuple[int, str]]:
    """Where a page gives the default run's time per step on a CPU: a time in a 'step' column
    of a table's default-run row, a time per step anywhere in that row, or a time per step in
    a sentence that names the default. As (line, value)."""
    found = []
    for start, header, rows in tables(page):
        step_columns = [i for i, h in enumerate(header) if re.search(r"\bstep\b", h, re.I)]
        for n, row in enumerate(rows, start + 2):
            if not DEFAULT_ROW.match(row[0]):
                continue
            values = [m.group(1) for i in step_columns if i < len(row)
                      for m in [re.fullmatch(TIME, row[i])] if m]  # fmt: skip
            values += [m.group(1) for m in PER_STEP.finditer(" ".join(row))]
            found += [(n, v) for v in values]
    for start, text in blocks(page):
        if text.startswith("|"):
            continue
        at = 0
        for sentence in re.split(r"(?<=[.;])\s+", text):
            at = text.index(sentence, at)
            if re.search(r"\bdefault\b", sentence):
                line = start + text[:at].count("\n")
                found += [(line, v) for pattern in IN_WORDS
                          for m in pattern.finditer(sentence) for v in m.groups() if v]  # fmt: skip
    return found


def test_the_default_step_time_is_stated_once() -> None:
    """One row of docs/benchmarks.md gives it (a value per CPU, with the command that measured
    it); every other page links there, so no page can give a second value for the same CPU."""
    where: dict[tuple[str, int], list[str]] = {}
    for page in PAGES:
        for line, value in default_step_times(page):
            where.setdefault((name(page), line), []).append(value)
    assert where, "no page gives the default run's step time: docs/benchmarks.md should"
    assert len(where) == 1 and next(iter(where))[0] == name(STEP_TIME_PAGE), (
        f"the default run's step time appears in more than one place: {where}"
    )
    [(_, line)] = where
    text = STEP_TIME_PAGE.read_text(encoding="utf-8").splitlines()[line - 1]
    assert "python train.py" in text, "the step time's row names the command that measured it"


# A repository path as the code cites one: a top-level package or folder, then a file name
# with its extension (scripts/bench/ns.py, conf/model/tiny.yaml, docs/fsdp.md).
CITED = re.compile(
    r"(?<![\w/.<])((?:model|optim|data|trainer|scripts|tests|stages|conf|docs)/[\w./-]*\w"
    r"\.(?:py|md|yaml|sh|txt|json|csv))"
)


def prose_of(source: str) -> list[tuple[int, str]]:
    """A Python file's docstrings and comments, each as (its first line, its text): what a
    reader takes on trust, unlike a string the code uses (a test's made-up file name)."""
    import ast
    import io
    import tokenize

    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr):
            value = node.body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append((node.body[0].lineno, value.value))
    return out


def test_docstrings_and_comments_cite_only_files_that_exist() -> None:
    """Every repository path a docstring or a comment names (optim/muon/update.py, tests/unit/
    test_muon.py, ...) exists: a file moved or renamed leaves no pointer to nowhere."""
    import subprocess

    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    missing = []
    for name in sorted(set(listed.stdout.split())):
        path = REPO / name
        if not path.exists():  # deleted in the working tree, not yet in git
            continue
        for line, text in prose_of(path.read_text(encoding="utf-8")):
            for cited in CITED.findall(text):
                if not (REPO / cited).exists():
                    missing.append(f"{name}:{line} cites {cited}")
    assert not missing, "files cited that do not exist:\n" + "\n".join(missing)
