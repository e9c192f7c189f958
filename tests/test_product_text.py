"""The product speaks only of itself: no development machine, no internal issue or round numbers.

A reader outside cannot look up an internal issue or a development round; a commit hash or an
upstream link they can. Upstream references stay allowed when the project is named next to the number
("ROCm/hip issue 3902", "pytorch #138722", "NVIDIA/warp#1957") or the number is part of a URL.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCOPE = ("rocm_vit", "backends", "docs", "tests", "ci", "benchmarks", "README.md")
TEXT_SUFFIXES = {".py", ".md", ".sh", ".txt", ".toml", ".cfg", ".ini", ".yaml", ".yml", ".json"}

# Words are split so that this file, which is in the scope, does not match itself.
_HOME = "/" + "work" + "/"
_ISSUE, _ROUND, _LENT, _SESSION, _PR = "iss" + "ue", "ro" + "und", "l" + "ent", "ses" + "sion", "P" + "R"
LEAKS = {
    "a path of the development machine": re.compile(re.escape(_HOME) + r"|\.lib" + r"rary\b|KIN" + r"DS\.md"),
    "the word for the borrowed development machines": re.compile(r"\bl" + r"ent\b", re.IGNORECASE),
    "a development round": re.compile(
        r"\bro" + r"unds? \d+"
        r"|\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
        r"|\w+teenth|twentieth|\d+(st|nd|rd|th)) ro" + r"und\b"
        r"|\*\*\d+(-\d+)?\*\* \(\d\d-\d\d\b",  # a history entry labelled by its round: a bold number, a date
        re.IGNORECASE,
    ),
    "a development session": re.compile(r"\bses" + r"sion \d+", re.IGNORECASE),
}
# An issue or PR number, or "#" and a number: internal unless an upstream project is the word before it.
# Not "()#3": a C++ lambda's number in a kernel's name.
NUMBERED_REFERENCE = re.compile(
    r"(?P<before>[\w./-]*)\s*(?P<ref>\b(?:issues?|PRs?|pull request) #?\d+|(?<!\(\))#\d+\b)", re.I
)
UPSTREAM = re.compile(
    r"(^|/)(sglang|vllm|pytorch|torch|rocm|hip|aiter|atom|triton|transformers|flash-attention|cutlass"
    r"|rocm-systems|warp|cuda-python|huggingface)$",
    re.IGNORECASE,
)
URL = re.compile(r"https?://\S+")


def numbered_internal_references(line: str) -> list[str]:
    """The issue or PR numbers in ``line`` that no upstream project or URL claims."""
    line = URL.sub("", line)
    found = []
    for match in NUMBERED_REFERENCE.finditer(line):
        before = match.group("before")
        if match.group("ref").startswith("#") and "/" in before:  # owner/repo#N
            continue
        if not UPSTREAM.search(before):
            found.append(match.group(0).strip())
    return found


def leaks_in(text: str) -> list[str]:
    """``line: what: the words`` for each leak in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for what, pattern in LEAKS.items():
            found += [f"{number}: {what}: {match.group(0)!r}" for match in pattern.finditer(line)]
        found += [f"{number}: an internal issue number: {ref!r}" for ref in numbered_internal_references(line)]
    return found


def product_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as error:
        pytest.skip(f"not a git checkout ({error}): the tracked files are the product")
    paths = [ROOT / name for name in listed.split("\0") if name]
    return [path for path in paths if path.suffix in TEXT_SUFFIXES or path.name == "README.md"]


def test_code_docs_tests_and_ci_do_not_speak_of_where_they_were_made() -> None:
    files = product_files()
    assert len(files) > 100, f"only {len(files)} files listed under {SCOPE}"
    leaks = [
        f"{path.relative_to(ROOT)}:{leak}"
        for path in files
        if path.exists()
        for leak in leaks_in(path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not leaks, "say what was measured or cite the commit:\n" + "\n".join(leaks)


@pytest.mark.parametrize(
    "line",
    [
        f"failed 4 of its first 6 calls ({_ISSUE} 44)",
        "the route to #" + "56's host goal",
        f"(docs/benchmarks.md, History, {_ROUND} 21)",
        f"(docs/benchmarks.md, History, eleventh {_ROUND})",
        f"{_ROUND}s 6-7",
        f"on the {_LENT} CUDA image",
        "(" + _HOME + ".lib" + "rary/device/KIN" + "DS.md)",
        f"8.43 ms over the last 1000 (H200, {_SESSION} 19)",
        f"the device-scoped fix, {_PR} 8338, was reverted",
        "- **1" + "3** (12-01, 8a25837): pools flat. **1" + "4** (12-01, 0ee67e4)",
    ],
)
def test_each_kind_of_leak_is_found(line: str) -> None:
    assert leaks_in(line)


@pytest.mark.parametrize(
    "line",
    [
        "ROCm/hip issue 3902 (MI355X)",
        "ROCm/rocm-systems issue 11698 (gfx950); rocm-systems PR 8338 reverted",
        "pytorch PR 187110, pytorch issue 155684, pytorch #138722",
        "NVIDIA/warp#1957 and ROCm/hip#3902; aiter PR 5605; SGLang #18784",
        "see https://github.com/pytorch/pytorch/issues/155684#issuecomment-1",
        "round(ms, 3) rounds once; a round trip; the other way round",
        "attach report.md to your issue",
        "at::native::GeluType)::{lambda()#3}::operator()() const",
        "since 7e093f3 (2026-12-05) captures run inline; - **2026-12-01** (8a25837): pools flat",
    ],
)
def test_upstream_references_and_plain_words_pass(line: str) -> None:
    assert leaks_in(line) == []
