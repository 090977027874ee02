"""The repository stands alone: no file cites a path outside it, and no docstring or comment
keeps a measurement log (figures live in docs/ with the command that measures them again).

Fails on the main of issue 10: ``pserver/comm/shm.py`` and ``pserver/comm/waiting.py`` cite
FACTS.md, a file of the machine the project was developed on, and ``pserver/optim/blas.py``,
``pserver/optim/rules.py`` and ``pserver/job/cli.py`` carry measured timings and percentages.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the notes beside the repository that helpers were given: never to be cited from inside it
OUTSIDE = re.compile(r"\.\./shared|/work/|\bFACTS\.md|\bDESIGN\.md|\bSTYLE\.md|shared/papers")
# a measured figure: a number with a unit of time, bandwidth or a share
FIGURE = re.compile(r"\d(?:[.,]\d+)?\s?(?:ms|µs|us|GB/s|GiB/s|MB/s|MiB/s|%)(?![\w/])")
THIS = Path(__file__).relative_to(ROOT).as_posix()
# figures that are rules, defaults or a paper's, not measurements: (file, text) -> why
NOT_MEASURED = {
    ("pserver/job/cli.py", "Python's default 5 ms"): "Python's documented default",
    ("pserver/comm/waiting.py", "default 50 µs"): "the kernel's documented default",
    ("pserver/plan/inject.py", "delays 0.16 % of the pull"): "the PSP paper's setting",
    ("pserver/dump/reader.py", "99 % of the gradients"): "the definition of a percentile",
    ("pserver/dump/writer.py", "at most ~10 %"): "the bound COPY_SHARE sets",
}


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        names = out.stdout.split()
    else:  # not a git checkout (an sdist): every file but the virtual environment's
        names = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()
                 and not {".venv", ".git", "__pycache__"} & set(p.parts)]  # fmt: skip
    return sorted(set(names) - {THIS})


def test_no_file_cites_a_path_outside_the_repository():
    found = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file() or path.suffix not in {".py", ".md", ".toml", ".cfg", ".sh",
                                                     ".txt", ".slurm", ""}:  # fmt: skip
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a Python file."""
    out = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and (
            i == 0 or tokens[i - 1].type in (tokenize.INDENT, tokenize.NEWLINE, tokenize.NL)
        ) and tok.string.lstrip("rRuUbB").startswith(('"""', "'''")):
            for k, line in enumerate(tok.string.splitlines()):
                out.append((tok.start[0] + k, line))
    return out


def test_no_measurement_log_in_docstrings_or_comments():
    """In the library (``pserver``, ``learners``); the benchmarks in ``scripts/`` quote the
    papers' figures and the issues' goals they measure against, and measure the rest."""
    found = []
    for pkg in ("pserver", "learners"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for number, text in prose(path):
                rel = path.relative_to(ROOT).as_posix()
                if FIGURE.search(text) and not any(
                    f == rel and t in text for f, t in NOT_MEASURED
                ):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {text.strip()}")
    assert not found, "move these figures to docs/ with their command:\n" + "\n".join(found)
