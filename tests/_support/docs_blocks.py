"""The code blocks of a Markdown page, and running them top to bottom as a reader would.

The conventions a page follows (HTML comments, invisible on the site, visible in the Markdown):

- `<!-- not-run: REASON -->` on the line before a block: the block is not run, for the reason given
  (`make ...`, `pip install`, a training, a cluster).
- `<!-- file: NAME -->` on the line before a block: the block is the file NAME (a config, a module);
  it is written into the page's folder before the page runs, and not run itself.
- `<!-- test-files: NAME, NAME -->` anywhere on the page: tiny real files that the page's commands
  read and that a reader has of their own (a buffer, a checkpoint); tests/docs/test_examples.py makes
  each NAME into the page's folder before it runs.

Every other ```python block runs in one namespace per page, every other ```bash block in bash
(`-e -o pipefail`) in the page's folder, in page order. A bash block runs only if each of its commands
is `jaxsal ...` or `python -m ...` (after `VAR=value` settings, as `JAXSAL_METHODS=m.py jaxsal ...`); any other block needs a `not-run` reason.

Run as a script (`python tests/_support/docs_blocks.py PAGE`, in the page's folder) it runs PAGE and exits 1
on the first block that fails, naming the page, the block and its line.
"""
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
MARK = re.compile(r"^\s*<!--\s*(not-run|file):\s*(.*?)\s*-->\s*$")
TEST_FILES = re.compile(r"<!--\s*test-files:\s*(.*?)\s*-->")
RUNNABLE_BASH = re.compile(r"^([A-Z_][A-Z0-9_]*=\S*\s+)*(jaxsal|python -m)\s")  # after VAR=value settings


@dataclass
class Block:
    page: str
    index: int          # 1-based, among the page's fenced blocks
    line: int           # 1-based line of the first code line
    lang: str
    code: str
    not_run: str | None = None
    file: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}, block {self.index} (```{self.lang}, line {self.line})"


def blocks(path: Path, page: str | None = None) -> list[Block]:
    """Every fenced block of the page, with the marker on the line just before it (if any)."""
    lines, out, i = path.read_text().splitlines(), [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, j = len(m["indent"]), i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        code = "\n".join(line[indent:] for line in lines[i + 1:j]) + "\n"
        b = Block(page or str(path), len(out) + 1, i + 2, m["lang"], code)
        mark = MARK.match(lines[i - 1]) if i else None
        if mark and mark[1] == "not-run":
            b.not_run = mark[2]
        elif mark:
            b.file = mark[2]
        out.append(b)
        i = j + 1
    return out


def declared_files(path: Path) -> list[str]:
    """The names a page's `<!-- test-files: ... -->` comments declare."""
    return [n.strip() for m in TEST_FILES.findall(path.read_text()) for n in m.split(",") if n.strip()]


def commands(code: str) -> list[str]:
    """A bash block's commands: comments dropped, continued lines joined."""
    joined = re.sub(r"\\\n", " ", code)
    return [c for c in (line.split(" #")[0].strip() for line in joined.splitlines()) if c and not c.startswith("#")]


def runs(b: Block) -> bool:
    return b.not_run is None and b.file is None and b.lang in ("python", "bash")


def unmarked(b: Block) -> str | None:
    """Why a block may not stay as it is: a non-runnable block without a reason, or an empty reason."""
    if b.not_run is not None:
        return None if b.not_run else "a not-run marker without a reason"
    if b.lang == "bash" and b.file is None:
        bad = [c for c in commands(b.code) if not RUNNABLE_BASH.match(c)]
        if bad:
            return f"runs {bad[0]!r}, which the tests do not run: mark it <!-- not-run: REASON -->"
    return None


def run_page(path: Path, page: str) -> int:
    """Write the page's file blocks, then run its blocks in order; 1 with the failing block named."""
    bs = blocks(path, page)
    for b in bs:
        if b.file:
            Path(b.file).parent.mkdir(parents=True, exist_ok=True)
            Path(b.file).write_text(b.code)
    sys.path.insert(0, os.getcwd())  # as for a script run in the folder: the page's own modules import
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    ns = {"__name__": "__main__"}
    for b in bs:
        if not runs(b):
            continue
        if b.lang == "python":
            try:  # line numbers as on the page, in tracebacks
                exec(compile("\n" * (b.line - 1) + b.code, page, "exec"), ns)
            except BaseException:
                traceback.print_exc()
                print(f"FAILED: {b.name}", file=sys.stderr)
                return 1
        else:
            r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", b.code], env=env)
            if r.returncode:
                print(f"FAILED: {b.name}: exit status {r.returncode}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_page(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else sys.argv[1]))
