"""The documentation stays true: every ```python block of README.md and docs/*.md runs, the
README stays short, and its links lead somewhere.

A block runs in a fresh namespace, in a folder of its own (files it writes land there), after
torch._dynamo.reset(); the blocks of one page share a subprocess (one import of torch each).
A block that cannot run here is fenced ```python no-run: <reason>, or starts with the line
`# not run: <reason>`: it is counted, and the runnable ones must stay above MIN_RUNNABLE, so
this test cannot pass by skipping everything.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]

MIN_RUNNABLE = 28  # runnable blocks over all pages (30 when this test was written)
README_MAX_LINES = 160
PARAGRAPH_MAX_WORDS = 120
PAGE_TIMEOUT_S = 600


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int  # of the block's first code line in the page, from 1
    code: str
    skip_reason: str | None  # why it is not run, or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


OPEN = re.compile(r"^```python(?:\s+(.*))?$")
NO_RUN = re.compile(r"^no-run(?::\s*(.*))?$")
NOT_RUN_LINE = re.compile(r"^# not run: *(.*)$")


def blocks(path: pathlib.Path) -> list[Block]:
    found, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        opened = OPEN.match(lines[i].strip())
        if not opened:
            i += 1
            continue
        start, i = i + 1, i + 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        assert i < len(lines), f"{path.name}:{start}: a ```python block is never closed"
        code = textwrap.dedent("\n".join(lines[start:i]))  # a block inside a list item is indented
        info, reason = (opened.group(1) or "").strip(), None
        if info:
            no_run = NO_RUN.match(info)
            assert no_run, f"{path.name}:{start}: unknown fence info {info!r} (only 'no-run: <reason>')"
            reason = no_run.group(1) or ""
        elif first := NOT_RUN_LINE.match(code.lstrip().split("\n", 1)[0]):
            reason = first.group(1)
        found.append(Block(path, start + 1, code, reason))
        i += 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
RUNNABLE = [b for b in ALL_BLOCKS if b.skip_reason is None]

# Runs in the subprocess: the page's runnable blocks, each in a fresh namespace and folder,
# with line numbers in tracebacks as in the page.
DRIVER = r"""
import json, logging, os, sys, time, traceback
import torch
todo = json.load(sys.stdin)
results = []
for block in todo:
    torch._dynamo.reset()
    environ, root_handlers = dict(os.environ), list(logging.getLogger().handlers)
    os.makedirs(block["cwd"], exist_ok=True)
    os.chdir(block["cwd"])
    start = time.perf_counter()
    try:
        code = compile("\n" * (block["line"] - 1) + block["code"], block["path"], "exec")
        exec(code, {"__name__": "__main__"})
        error = None
    except BaseException:
        error = traceback.format_exc()
    results.append({"where": block["where"], "seconds": round(time.perf_counter() - start, 2), "error": error})
    os.environ.clear()
    os.environ.update(environ)
    logging.getLogger().handlers[:] = root_handlers
print("RESULTS " + json.dumps(results))
"""


def _pages_with_runnable():
    return [p for p in PAGES if any(b.path == p for b in RUNNABLE)]


@pytest.mark.parametrize("page", _pages_with_runnable(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page, tmp_path):
    todo = [
        {"where": b.where, "path": str(b.path), "line": b.line, "code": b.code, "cwd": str(tmp_path / f"block{k}")}
        for k, b in enumerate(b for b in RUNNABLE if b.path == page)
    ]
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(todo),
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT_S,
        cwd=tmp_path,
    )
    marker = [line for line in proc.stdout.splitlines() if line.startswith("RESULTS ")]
    assert proc.returncode == 0 and marker, f"the driver failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}"
    results = json.loads(marker[-1][len("RESULTS ") :])
    assert len(results) == len(todo)
    failed = [f"{r['where']} ({r['seconds']} s):\n{r['error']}" for r in results if r["error"]]
    assert not failed, "\n".join(failed)


def test_enough_blocks_run():
    skipped = [b for b in ALL_BLOCKS if b.skip_reason is not None]
    for b in skipped:
        assert b.skip_reason.strip(), f"{b.where}: a block that is not run must say why"
    assert len(RUNNABLE) >= MIN_RUNNABLE, (len(RUNNABLE), [b.where for b in skipped])
    assert len(skipped) <= len(RUNNABLE) // 4, [b.where for b in skipped]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)


def paragraphs(path: pathlib.Path) -> list[tuple[int, str]]:
    """(line, text) of each paragraph outside code blocks: runs of lines between blank
    lines; a list item, a table row or a heading is a paragraph of its own."""
    found, current, fenced = [], None, False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.strip()
        if text.startswith("```"):
            fenced, current = not fenced, None
            continue
        if fenced or not text:
            current = None
            continue
        if current is None or text.startswith(("|", "#")) or re.match(r"([-*]|\d+\.) ", text):
            current = [n, text]
            found.append(current)
        else:
            current[1] += " " + text
        if text.startswith(("|", "#")):
            current = None
    return [tuple(p) for p in found]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_paragraphs_are_short(page):
    long = [(n, len(text.split())) for n, text in paragraphs(page) if len(text.split()) > PARAGRAPH_MAX_WORDS]
    assert not long, f"{page.name}: paragraphs over {PARAGRAPH_MAX_WORDS} words (line, words): {long}"


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page):
    targets = [t for t in LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_readme_links_every_page():
    linked = {(ROOT / t).resolve() for t in LINK.findall(README.read_text()) if "://" not in t}
    pages = {p.resolve() for p in PAGES if p != README}
    assert pages, "no docs/*.md"
    assert pages <= linked, f"pages README.md does not link: {sorted(p.name for p in pages - linked)}"


def test_readme_test_command_is_what_ci_runs():
    """.ci/run runs README's test command (pip made quiet): the two must not drift apart."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "python -m pytest" in line]
    assert len(ci) == 1, ci
    readme = [line for line in README.read_text().splitlines() if line.startswith("python3 -m venv") and "pytest" in line]
    assert len(readme) == 1, readme
    quiet = lambda s: s.replace("pip install -q ", "pip install ")  # noqa: E731
    assert quiet(readme[0]).endswith(quiet(ci[0].strip())), (readme[0], ci[0])
