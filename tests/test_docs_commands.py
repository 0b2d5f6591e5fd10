"""Every shell block of README.md and docs/*.md runs, on tiny inputs, so that the docs say what the code does.

A block is a fenced block marked bash, sh or shell, a console block with a ``$ `` line, or an unmarked
block whose first line is a command (``$ ...`` or a known program). Its command lines (``$ `` lines in a console block, every line in
a bash block; ``\\`` continues a line, ``#`` lines are comments) run in order, in one bash script, in a
copy of a folder of prepared inputs (tiny image folders, a few short runs, weights files), with the
installed ``vitkit`` command (served by tests/cli_server.py, which imports torch once).

The docs name real data and budgets (``--data cifar10/train --max-minutes 30``); ``SUBSTITUTIONS`` below
maps them to tiny ones, in the open, and ``tiny_budget`` bounds every training run. Each command must
exit 0, or non-zero where the doc shows an ``error:`` line, which the command must print; an output line
the doc shows with no figure in it (``wrote explain.png``, ``same weights``) must be printed as shown. No
command may print a traceback.

A block that cannot run here (it needs the network, a GPU, several machines, hours, or a package install)
carries a marker on the line before its fence, in the markdown itself::

    <!-- not run: needs the network -->

A new block without a marker runs like the others, so a block that does not run fails this test until a
substitution or a marker says how to take it. The relative links between the docs are checked too.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cli_server import write_shim
from helpers import image_folder, noise_image

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINKED = [*DOCS, ROOT / "CONTRIBUTING.md"]

MARKER = re.compile(r"^<!--\s*not run:\s*(?P<why>\S.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")
SHELL = {"bash", "sh", "shell", "console"}
PROGRAMS = ("vitkit", "python", ".venv/", "bash", "torchrun", "pip", "cmp", "grep", "cat")

# The docs' data, weights and budgets -> the prepared inputs (see ``prepared``), in this order, applied to
# every command line. (regex, replacement); a doc that needs another adds a row here.
SUBSTITUTIONS: list[tuple[str, str]] = [
    (r"(?<![\w/])(?:path/to/folder|imagenet/?|/data/imagenet|flowers/?|cifar8/train|jpegs)(?=\s|$)", "photos/"),
    (r"(?<![\w/])cifar10/train/?", "cifar10/"),
    (r"--data small(?=\s|$)", "--data photos/"),
    (r"/tmp/dp_cifar", "cifar10/"),
    (r"/tmp/", "tmp/"),
    (r"(?<![\w/])runs/demo_mini\b", "runs/demo"),
    (r"(?<![\w/])runs/(?:x|vit)/best\b", "runs/vit/best"),
    (r"(?<![\w/])runs/(?:pretrained|mini)\b", "runs/photos"),
    (r"(?<![\w/])runs/ft(?=\s|$)", "runs/digits"),
    (r"(?<![\w/])ckpt(?= )", "runs/demo/best"),
    (r"(?<![\w/])vit_(?:small|base)_patch16_224\.safetensors", "mini_timm.safetensors"),
    (r"(?<![\w/])hf-vit-base/", "hf-vit-test/"),
    (r"--img-size 384", "--img-size 48"),
    (r"--model vit_(?:small|base|large)_patch16_224", "--model vit_mini_patch4_28"),
    (r"--model vit_(?:tiny|small|base)_patch4_32", "--model vit_test"),
    (r"--config configs/pretrain.toml", "--config configs/pretrain.toml --model vit_test"),
    (r"--nproc_per_node=\d+", "--nproc_per_node=1"),
    (r"(?<=bench )vit_tiny_patch16_224", "vit_test"),
    (r"--batch-sizes 1,\d+", "--batch-sizes 1,2"),
    (r"--repeats \d+", "--repeats 1"),
    # last: the repository's path, which the rows above (e.g. /tmp/) must not rewrite
    (r"(?<![\w/])benchmarks/compare_runs\.py", str(ROOT / "benchmarks" / "compare_runs.py")),
]


def strip_comment(command: str) -> str:
    """The command without a trailing ``# comment`` (the docs quote no ``#``)."""
    return re.sub(r"(^|\s)#\s.*$", "", command).rstrip()


def substitute(command: str) -> str:
    command = strip_comment(command)
    for pattern, replacement in SUBSTITUTIONS:
        command = re.sub(pattern, replacement, command)
    return command


TRAINING = re.compile(r"(?P<launcher>torchrun .*)?(?P<verb>(?<![\w-])vitkit (?:train|finetune))\b(?P<args>[^;&|>]*)")
TINY = "--batch-size 8 --threads 1 --device cpu --set plots=false"
TINY_MINUTES = 0.25  # a doc's --max-minutes up to this runs as shown (a replay of a run bounded by the clock)


def tiny_budget(command: str) -> str:
    """Every `vitkit train` / `finetune` that starts a run trains one epoch (or for a doc's clock of at most
    TINY_MINUTES, that clock) of batches of 8, one process
    (under torchrun: the processes it starts) of one thread, no plots; a run given by `--resume` or replayed
    by `--config RUN` keeps the budget its run had (`--epochs N` there, a longer replay, becomes 2). The
    demo (no --data, no --config) trains the demo's model on the tiny `digits` folder (the built-in set's
    own path: tests/test_demo.py)."""

    def bound(m: re.Match) -> str:
        args = m.group("args")
        if "--resume" in args or re.search(r"--config runs/", args):
            return m.group(0).replace(m.group("args"), re.sub(r"--epochs \d+", "--epochs 2", args))
        clock = re.search(r"--max-minutes (\S+)", args)
        seconds = clock is not None and float(clock.group(1)) <= TINY_MINUTES  # a tiny clock: kept as it is
        args = re.sub(r"--(?:epochs|nproc|batch-size) \S+" if seconds else r"--(?:max-minutes|epochs|nproc|batch-size) \S+",
                      "", args)
        data = "" if "--data" in args or "--config" in args else " --data digits"
        procs = "" if m.group("launcher") else " --nproc 1"
        length = "" if seconds else " --epochs 1"
        return f"{m.group('launcher') or ''}{m.group('verb')}{length}{procs} {TINY}{data}{args}"

    return TRAINING.sub(bound, command)


# ----------------------------------------------------------------------------------------- the blocks
@dataclass
class Command:
    line: str  # as the doc shows it
    shown: list[str] = field(default_factory=list)  # the output the doc shows after it


@dataclass
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: list[str]
    not_run: str | None  # the marker's reason

    @property
    def name(self) -> str:
        where = self.doc.relative_to(ROOT) if self.doc.is_relative_to(ROOT) else self.doc.name
        return f"{where}:{self.line}"

    def commands(self) -> list[Command]:
        prompt = any(b.startswith("$ ") for b in self.body)
        out: list[Command] = []
        continued = False
        for raw in self.body:
            text = raw.rstrip()
            if continued:
                out[-1].line += " " + text.strip()
            elif prompt and text.startswith("$ "):
                out.append(Command(text[2:]))
            elif not prompt and text.strip() and not text.lstrip().startswith("#"):
                out.append(Command(text.strip()))
            elif prompt and out and not text.lstrip().startswith("#"):
                out[-1].shown.append(text)
            continued = text.endswith("\\")
            if continued:
                out[-1].line = out[-1].line[:-1].rstrip()
        return out


def blocks(doc: Path) -> list[Block]:
    """The shell blocks of ``doc``: fenced bash/sh/shell/console blocks, and unmarked ones that start with
    a command."""
    lines = doc.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang, body = i, m["lang"], []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][len(m["indent"]):])
            i += 1
        i += 1
        first = next((b.strip() for b in body if b.strip()), "")
        prompted = any(b.startswith("$ ") for b in body)
        if (lang in SHELL and (prompted or lang != "console")) or (
                not lang and (first.startswith("$ ") or first.startswith(PROGRAMS))):
            before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            marker = MARKER.match(before)
            found.append(Block(doc, start + 1, lang, body, marker["why"] if marker else None))
    return found


ALL = [b for doc in DOCS for b in blocks(doc)]


# ---------------------------------------------------------------------------------- prepared inputs
def _train(bin_dir: Path, cwd: Path, *args: str) -> None:
    """A prepared run; its decoded images are cached beside the prepared inputs, never in the user's cache
    (this runs before the per-test fixtures set $XDG_CACHE_HOME)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cwd.parent / "xdg-cache")}
    subprocess.run([str(bin_dir / "vitkit"), "train", *args, "--threads", "1", "--device", "cpu", "--quiet",
                    "--set", "plots=false"], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def _prepare(base: Path, bin_dir: Path) -> None:
    """The inputs the docs' commands name, after ``SUBSTITUTIONS``: image folders, runs and weights."""
    import torch

    import vitkit
    from vitkit.io.convert import to_hf
    from vitkit.io.timm import save_timm, to_timm

    image_folder(base / "photos")  # train/ and test/ of two classes, 32 px RGB
    image_folder(base / "cifar10", classes=[f"c{i}" for i in range(4)], n=6, test=2)
    for c in range(10):  # a class folder of grey 28-px digits, and a stray file predict skips
        (base / "digits" / str(c)).mkdir(parents=True)
        for i in range(5):
            noise_image(28, 28, seed=10 * c + i, channels=1).point(lambda v, c=c: v // 2 + 30 * c).save(
                base / "digits" / str(c) / f"{i}.png")
    (base / "digits" / "notes.jpg").write_text("not an image")
    noise_image(28, 28, seed=99, channels=1).save(base / "digit.png")
    noise_image(64, 48, seed=98).save(base / "cat.jpg")
    (base / "configs").symlink_to(ROOT / "configs")
    _train(bin_dir, base, "--data", "digits", "--out", "runs/demo", "--epochs", "1", "--batch-size", "8",
           "--set", "data.val_fraction=0.1")  # the demo's model, on the tiny digits
    for data in ("photos", "digits"):
        _train(bin_dir, base, "--data", data, "--model", "vit_test", "--epochs", "1", "--batch-size", "8",
               "--out", f"runs/{data}", "--set", "data.val_fraction=0.1")
    vitkit.save(vitkit.create_model("vit_tiny_patch16_224", num_classes=10, seed=0), base / "runs/vit/best")
    save_timm(vitkit.create_model("vit_mini_patch4_28", seed=0), base / "mini_timm.safetensors")
    to_hf(vitkit.create_model("vit_test", seed=0), base / "hf-vit-test")
    torch.save(to_timm(vitkit.create_model("vit_small_patch16_224", seed=0)), base / "vit_small_patch16_224.pth")


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """(a folder of the prepared inputs, a bin folder whose `vitkit` is served by one process)."""
    root = tmp_path_factory.mktemp("docs")
    socket_path = str(root / "vitkit.sock")
    server = subprocess.Popen([sys.executable, str(Path(__file__).with_name("cli_server.py")), socket_path],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready"
        bin_dir = root / "bin"
        write_shim(bin_dir, socket_path)
        _prepare(root / "base", bin_dir)
        yield root / "base", bin_dir
    finally:
        server.kill()
        server.wait()


# ------------------------------------------------------------------------------------------- the tests
def _script(commands: list[Command]) -> str:
    lines = ["cd \"$(dirname \"$0\")/work\""]
    for i, c in enumerate(commands):
        lines += [f"{{ {tiny_budget(substitute(c.line))}", f"}} > ../out{i} 2>&1 < /dev/null", f"echo $? > ../rc{i}"]
    return "\n".join(lines) + "\n"


def _fixed(shown: str) -> bool:
    """An output line that any run prints as the doc shows it: no figure in it (figures differ on tiny
    inputs), not an elision, an error (checked apart) or a blank."""
    text = shown.strip()
    return bool(text) and text != "..." and "error:" not in text and not re.search(r"\d", text)


def _workspace(base: Path, work: Path, commands: list[Command]) -> None:
    """The block's working folder: links to the prepared inputs, a copy of the runs (commands write into
    them), less the runs the block's own commands train (a run directory is not trained twice)."""
    work.mkdir()
    for entry in base.iterdir():
        if entry.name == "runs":
            shutil.copytree(entry, work / "runs")
        else:
            (work / entry.name).symlink_to(entry)
    for c in commands:
        for m in TRAINING.finditer(substitute(c.line)):
            if out := re.search(r"--out (\S+)", m.group("args")):
                shutil.rmtree(work / out.group(1), ignore_errors=True)


@pytest.mark.parametrize("block", ALL, ids=[b.name for b in ALL])
def test_doc_block_runs(block: Block, prepared, tmp_path, monkeypatch):
    """Each command of the block exits as the doc shows (0, or non-zero with the error line shown)."""
    if block.not_run:
        pytest.skip(f"not run: {block.not_run}")
    base, bin_dir = prepared
    commands = block.commands()
    assert commands, f"{block.name}: a shell block with no command"
    _workspace(base, tmp_path / "work", commands)
    (tmp_path / "block.sh").write_text(_script(commands))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty Hub cache, whatever the user's holds
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}")
    shell = subprocess.run(["bash", str(tmp_path / "block.sh")], capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, f"{block.name}: the block's script failed:\n{shell.stderr}"
    for i, c in enumerate(commands):
        ran = tiny_budget(substitute(c.line))
        out = (tmp_path / f"out{i}").read_text()
        rc = int((tmp_path / f"rc{i}").read_text())
        where = f"{block.name}: `{c.line}` ran as `{ran}`, exit {rc}:\n{out[-3000:]}"
        assert "Traceback" not in out, where
        errors = [substitute(s.strip()) for s in c.shown if "error:" in s]
        assert rc != 0 if errors else rc == 0, where
        for line in errors + [substitute(s.strip()) for s in c.shown if _fixed(s)]:
            assert line in out, f"{where}\nshown, not printed: {line}"


def test_every_marker_precedes_a_shell_block():
    """A marker that no longer sits before a shell block (the block moved or became text) is stale."""
    for doc in DOCS:
        lines = doc.read_text().splitlines()
        marked = {b.line for b in blocks(doc) if b.not_run}
        for i, text in enumerate(lines):
            if MARKER.match(text.strip()):
                fence = next(j for j in range(i + 1, len(lines)) if lines[j].strip())
                assert fence + 1 in marked, f"{doc.relative_to(ROOT)}:{i + 1}: a marker with no shell block after it"


def test_the_blocks_are_found(tmp_path):
    """The finder sees the blocks it must: a console block, a bash block, an unmarked command block, and
    skips an unmarked block of output and a console block with no command."""
    text = "\n".join(["```console", "$ vitkit list", "name", "```", "<!-- not run: needs the network -->",
                      "```bash", "pip install x  # a comment", "```", "```", "$ vitkit eval runs/a \\", "  --json",
                      "```", "```", "runs/<name>/", "  config.json", "```", "```console", "img/s 16.7", "```"])
    doc = tmp_path / "probe.md"
    doc.write_text(text)
    found = blocks(doc)
    assert [(b.line, b.lang, b.not_run) for b in found] == [(1, "console", None), (6, "bash", "needs the network"),
                                                             (9, "", None)]
    assert [c.line for c in found[0].commands()] == ["vitkit list"] and found[0].commands()[0].shown == ["name"]
    assert [c.line for c in found[2].commands()] == ["vitkit eval runs/a --json"]


def test_substitutions_and_budget():
    assert substitute("vitkit train --data cifar10/train --max-minutes 30") == "vitkit train --data cifar10/ --max-minutes 30"
    bounded = shlex.split(tiny_budget("vitkit train --data photos/ --max-minutes 30 --nproc 2 --out runs/p"))
    assert bounded[:5] == ["vitkit", "train", "--epochs", "1", "--nproc"] and bounded[-4:] == ["--data", "photos/",
                                                                                                 "--out", "runs/p"]
    assert "--max-minutes" not in bounded and bounded.count("--nproc") == 1
    assert tiny_budget("vitkit train --config runs/a --out runs/b") == "vitkit train --config runs/a --out runs/b"
    assert tiny_budget("vitkit train --config runs/a --epochs 10") == "vitkit train --config runs/a --epochs 2"
    demo = tiny_budget("vitkit train --out runs/demo > log 2>&1; cat log")
    assert demo.startswith("vitkit train --epochs 1 --nproc 1 ") and "--data digits --out runs/demo >" in demo
    launched = tiny_budget("torchrun --nproc_per_node=1 -m vitkit train --data photos/")
    assert launched.startswith("torchrun --nproc_per_node=1 -m vitkit train --epochs 1 --batch-size 8 ")
    assert "--nproc " not in launched and launched.endswith("--data photos/")


# -------------------------------------------------------------------------------------------- links
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _anchors(doc: Path) -> set[str]:
    """GitHub's anchors of ``doc``'s headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for line in doc.read_text().splitlines():
        if m := re.match(r"^#+\s+(.*)$", line):
            anchors.add(re.sub(r"[^\w\- ]", "", m[1].strip().lower()).replace(" ", "-"))
    return anchors


def test_links_between_docs_resolve():
    """Every relative link of README.md, CONTRIBUTING.md and docs/*.md names a file that exists and, with a
    #fragment, a heading of it."""
    bad = []
    for doc in LINKED:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for m in LINK.finditer(text):
            target = m["target"]
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target}: no such file")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                bad.append(f"{doc.relative_to(ROOT)}: {target}: no such heading")
    assert not bad, "\n".join(bad)
