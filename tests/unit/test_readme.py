"""Every command README.md and the docs/ pages print is one that runs as printed: each
`train.py` command's overrides name real keys and options and compose into a valid config,
and each script command names a script that exists with the flags it is given. The pages
hold together: README links every docs page, every relative link points to a file, and each
page says what it is and links back, and no file cites a document the project does not hold.
(Running the short commands: tests/e2e/test_readme_runs.py.)"""

import re
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import compose_config
from trainer.cli.overrides import check_command_line, compose_and_validate
from trainer.config import Config

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]


def name(page: Path) -> str:
    return str(page.relative_to(REPO))


def page_commands(page: Path) -> list[list[str]]:
    """The shell commands in a page's bash blocks, as argument lists (comments dropped,
    continuation lines joined)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def readme_commands() -> list[list[str]]:
    return page_commands(README)


def train_overrides(words: list[str]) -> list[str] | None:
    """The arguments after train.py of a `python train.py` / `torchrun ... train.py` command."""
    if "train.py" not in words or words[0] not in ("python", "torchrun"):
        return None
    return words[words.index("train.py") + 1 :]


TRAIN = [
    (name(page), " ".join(w), a)
    for page in PAGES
    for w in page_commands(page)
    if (a := train_overrides(w)) is not None
]


def test_the_pages_have_their_commands() -> None:
    assert len(TRAIN) > 20
    assert any(a == [] for _, _, a in TRAIN)  # the default run
    shown = {page for page, _, _ in TRAIN}
    assert {"README.md", "docs/training.md", "docs/speedruns.md"} <= shown, shown


def test_the_readmes_two_commands_are_what_ci_runs() -> None:
    """README's first block is the two commands from a fresh machine, and .ci/run tests with
    the second of them: what README promises is what CI proves."""
    first = re.search(r"## Two commands\n.*?```bash\n(.*?)```", README.read_text(), re.DOTALL)
    assert first, "README.md has no bash block under '## Two commands'"
    commands = [shlex.split(x, comments=True) for x in first.group(1).splitlines()]
    assert commands == [["make", "train"], ["make", "test"]], commands
    ci = [x.strip() for x in (REPO / ".ci/run").read_text().splitlines()]
    assert "make test" in ci, ".ci/run no longer runs README's test command"


@pytest.mark.parametrize(
    ("page", "shown", "args"), TRAIN, ids=[f"{p}:{s[:50]}" for p, s, _ in TRAIN]
)
def test_each_train_command_composes_a_valid_config(page: str, shown: str, args: list[str]) -> None:
    check_command_line(args, CONF, Config)
    if "-m" in args or "--multirun" in args:
        return  # each job of a sweep is one value of each swept key: checked above
    compose_and_validate(args, CONF)  # files a command reads are checked when it runs


def page_scripts(page: Path) -> dict[str, set[str]]:
    """Each script a page runs (`python -m pkg.mod` or `python scripts/<name>.py`) with every
    --flag it is given there."""
    scripts: dict[str, set[str]] = {}
    for w in page_commands(page):
        if w[0] != "python" or len(w) < 2 or w[1] == "train.py":
            continue
        script = w[2] if w[1] == "-m" else w[1]
        flags = {a.split("=")[0] for a in w[2:] if a.startswith("--")}
        scripts.setdefault(script, set()).update(flags)
    return scripts


def all_scripts() -> dict[str, dict[str, set[str]]]:
    """Script -> page -> the flags that page gives it."""
    found: dict[str, dict[str, set[str]]] = {}
    for page in PAGES:
        for script, flags in page_scripts(page).items():
            found.setdefault(script, {})[name(page)] = flags
    return found


def script_path(script: str) -> Path:
    """The file a script name runs: a path, a module, or a package's __main__.py."""
    if script.endswith(".py"):
        return REPO / script
    module = REPO / (script.replace(".", "/") + ".py")
    return module if module.is_file() else REPO / script.replace(".", "/") / "__main__.py"


def test_the_pages_run_their_scripts() -> None:
    assert len(all_scripts()) >= 5, all_scripts()


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_the_scripts_a_page_names_exist(page: Path) -> None:
    for script in page_scripts(page):
        assert script_path(script).is_file(), f"{name(page)} runs {script}, which does not exist"


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")  # runpy, harmless
@pytest.mark.parametrize("script", sorted(all_scripts()))
def test_each_script_takes_the_flags_the_pages_give_it(
    script: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's own --help (run as `python ...` runs it) lists every flag a page uses."""
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as done:
        if script.endswith(".py"):
            runpy.run_path(str(REPO / script), run_name="__main__")
        else:
            runpy.run_module(script, run_name="__main__", alter_sys=False)
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    for page, flags in all_scripts()[script].items():
        missing = [flag for flag in sorted(flags) if flag not in out]
        assert not missing, f"{page} gives {script} {missing}, which its --help lacks"


def links(page: Path) -> list[str]:
    """The targets of a page's Markdown links and images, outside code blocks."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_the_readme_links_every_docs_page() -> None:
    linked = {(REPO / t.split("#")[0]).resolve() for t in links(README)}
    missing = [name(p) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md links no {missing}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_points_to_a_file(page: Path) -> None:
    targets = [t for t in links(page) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    broken = [t for t in targets if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{name(page)} links to {broken}, which do not exist"


@pytest.mark.parametrize("page", DOCS, ids=name)
def test_each_docs_page_says_what_it_is_and_links_back(page: Path) -> None:
    title, blank, *rest = page.read_text().splitlines()
    assert re.match(r"# \S", title) and blank == "", f"{name(page)} starts without a title"
    opening = " ".join(rest[: rest.index("")] if "" in rest else rest)
    assert "(../README.md)" in opening, f"{name(page)}'s opening does not link back to README.md"
    assert opening.rstrip().endswith("."), f"{name(page)}: no sentence under its title"


def test_the_cpu_kinds_benchmark_times_the_pages_toy_commands() -> None:
    """scripts/bench/cpu_kinds.py --toys times the toy commands as docs/speedruns.md shows
    them."""
    from scripts.bench.cpu_kinds import TOYS

    text = (REPO / "docs/speedruns.md").read_text(encoding="utf-8")
    for toy, overrides in TOYS.items():
        assert f"python train.py {overrides}" in text, toy


def test_the_gpu_proof_renders_into_its_page() -> None:
    """`gpu_proof --render` writes between markers that its default page holds, once."""
    from scripts.bench.gpu_proof import BEGIN, DOC, END

    text = DOC.read_text()
    assert DOC == REPO / "docs/gpu-proof.md"
    assert text.count(BEGIN) == 1 and text.count(END) == 1 and text.index(BEGIN) < text.index(END)


OUTSIDE = re.compile(r"\.\./shared|shared[/](docs|reference)|RECORD(S|_[A-Z]+)[.]md")


def test_no_file_cites_a_document_outside_the_project() -> None:
    """A clone has no spec files beside it: code, tests and pages cite docs/records.md."""
    listed = ["git", "ls-files", "-co", "--exclude-standard", "*.py", "*.md", "*.yaml"]
    files = subprocess.run(listed, cwd=REPO, capture_output=True, text=True, check=True)
    cites = [
        f"{f}:{n}"
        for f in files.stdout.splitlines()
        if (REPO / f).is_file()
        for n, line in enumerate((REPO / f).read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not cites, f"these lines cite files outside the project: {cites}"


TOY_RUNS = [
    (shown, args)
    for page, shown, args in TRAIN
    if page == "README.md"
    and "size=toy" in args
    and any(a.startswith("experiment=record") for a in args)
]


@pytest.mark.parametrize(("shown", "args"), TOY_RUNS, ids=[s[:60] for s, _ in TOY_RUNS])
def test_the_readmes_record_toys_read_their_data_once(
    shown: str, args: list[str], corpus_cache: Path, tmp_path: Path
) -> None:
    """A toy the README shows does not wrap the sample corpus: its training loss would fall
    partly by memorisation, and the run would say so at startup (trainer/session.py)."""
    from data.build import build_data
    from trainer.config import to_config
    from trainer.observe.progress import Progress
    from trainer.schedule import Schedule
    from trainer.session import data_wrap_warning

    conf = to_config(
        compose_config([*args, f"data.cache_dir={corpus_cache}", f"run_dir={tmp_path}"])
    )
    t = conf.train
    loader, _ = build_data(
        conf.data, batch_size=t.batch_size, seq_len=t.seq_len, val_tokens=t.val_tokens,
        val_batch_size=t.val_rows(1), val_seq_len=t.val_seq_len or t.seq_len, seed=conf.seed,
        rank=0, world_size=1, progress=False,
    )  # fmt: skip
    schedule = Schedule.for_run(t, conf.optim, conf.model, conf.data)
    assert data_wrap_warning(conf, loader, schedule, Progress()) is None, shown
