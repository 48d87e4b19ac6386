"""The docs stay a user's manual that matches the code.

- README.md is one screen (at most 120 lines) and links every page of docs/; every page is at most 500 lines;
- every option key the code knows (config/options.py's key table) is in docs/configs.md's option table, and every key
  in that table is one the code knows;
- every `gebackend SUBCOMMAND --flag` quoted in README.md and docs/ (in code blocks or backticks) names a real
  subcommand, and each flag is accepted by that subcommand's parser;
- every relative link in README.md and docs/ reaches a file, and every #anchor a heading of that file;
- nothing in the tree speaks of how the work was organised (numbered or "this"/"earlier" development sessions, the
  development machine): the project, its users and its machines only.

docs/results/README.md is linked from the pages that quote results (docs/benchmarks.md and others), not from the
README; it is checked like every page for its links and quoted commands.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from gebackend.cli.main import build_parser
from gebackend.config.options import KNOWN_KEYS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 120
MAX_PAGE_LINES = 500

PAGES = sorted(DOCS.glob("*.md"))
ALL_DOCS = [README, *sorted(DOCS.rglob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------------------------------------- sizes and the index


def test_the_readme_is_one_screen():
    count = len(_lines(README))
    assert count <= MAX_README_LINES, f"README.md has {count} lines, more than {MAX_README_LINES}"


def test_the_readme_links_every_page():
    linked = {(README.parent / target).resolve() for target in re.findall(r"\]\(([^)#\s]+)", README.read_text())}
    missing = [_rel(page) for page in PAGES if page.resolve() not in linked]
    assert not missing, f"README.md does not link these pages: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_is_short(page: Path):
    count = len(_lines(page))
    assert count <= MAX_PAGE_LINES, f"{_rel(page)} has {count} lines, more than {MAX_PAGE_LINES}: split it by topic"


# ---------------------------------------------------------------------------------------------- the option table


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells (a `\\|` inside a cell is no separator)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def _option_table() -> dict[str, int]:
    """docs/configs.md's option table (the section "## Backend options"): key -> its line number."""
    lines = _lines(DOCS / "configs.md")
    start = lines.index("## Backend options")
    keys: dict[str, int] = {}
    rows = 0
    for number, line in enumerate(lines[start + 1:], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|") or set(line) <= set("|- :"):
            continue
        rows += 1
        first = _cells(line)[0]
        if rows == 1 or first.startswith("**"):  # the header row, or a group's title row
            continue
        found = re.findall(r"`([^`]+)`", first)
        assert found, f"docs/configs.md:{number}: an option row names no `key` in its first cell: {first!r}"
        for key in found:
            keys[key] = number
    assert keys, "docs/configs.md has no option table under '## Backend options'"
    return keys


def test_every_option_key_the_code_knows_is_documented():
    missing = sorted(KNOWN_KEYS - set(_option_table()))
    assert not missing, f"option keys the code knows (config/options.py) missing from docs/configs.md's table: {missing}"


def test_every_key_in_the_option_table_is_one_the_code_knows():
    table = _option_table()
    unknown = {key: f"docs/configs.md:{line}" for key, line in table.items() if key not in KNOWN_KEYS}
    assert not unknown, f"keys in docs/configs.md's option table that config/options.py does not know: {unknown}"


# ---------------------------------------------------------------------------------------------- quoted commands


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for option in parser._option_string_actions if option.startswith("--")}


COMMANDS = _subparsers(build_parser())
# `gebackend WORD ...` where gebackend is a command: at the start, after a space, `$`, `(` or a path (`.venv/bin/`)
_COMMAND = re.compile(r"(?:^|(?<=[\s$(/]))gebackend[ \t]+([A-Za-z][\w-]*)([^\n]*)")
_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*")
_END = re.compile(r"\s#|\s\|\s|;|&&|>|`")  # a comment, a pipe, the next command, a redirection


def _snippets(path: Path):
    """(line number, text) of every code line (continuations joined) and inline code span of a Markdown file."""
    lines = _lines(path)
    prose = list(lines)
    fence, pending, pending_at = False, "", 0
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            prose[number - 1] = ""
            continue
        if fence:
            prose[number - 1] = ""
            pending_at = pending_at or number
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            yield pending_at, pending + line
            pending, pending_at = "", 0
    text = "\n".join(prose)
    for match in re.finditer(r"`([^`]+)`", text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1).replace("\n", " ")


def _quoted_commands():
    for path in ALL_DOCS:
        for number, snippet in _snippets(path):
            for match in _COMMAND.finditer(snippet):
                rest = _END.split(match.group(2), maxsplit=1)[0]
                yield f"{_rel(path)}:{number}", match.group(1), rest


def _check(word: str, rest: str) -> list[str]:
    tokens = rest.replace("[", " ").replace("]", " ").split()
    if "--" in tokens:  # what follows goes to tritonserver unchanged
        tokens = tokens[:tokens.index("--")]
    flags = [m.group(0) for t in tokens if (m := _FLAG.match(t))]
    if word not in COMMANDS:
        return [f"'gebackend {word}' is no subcommand (there are {sorted(COMMANDS)})"] if flags else []
    parser = COMMANDS[word]
    allowed = _flags(parser)
    actions = _subparsers(parser)
    if actions:  # `gebackend profile start --model ...`: the action's own flags
        action = next((t for t in tokens if not t.startswith("-")), "")
        chosen = [actions[action]] if action in actions else list(actions.values())
        allowed |= set().union(*(_flags(p) for p in chosen))
    return [f"'gebackend {word}' has no flag {flag}" for flag in flags if flag not in allowed]


def test_the_command_check_can_fail():
    assert _check("bench", "--quick --no-such-flag") == ["'gebackend bench' has no flag --no-such-flag"]
    assert _check("benchmark", "--quick")
    assert _check("profile", "start --model m --out x") == []
    assert _check("profile", "stop --out x") == ["'gebackend profile' has no flag --out"]
    assert _check("serve", "REPO --http-port 1 -- --http-address=127.0.0.1") == []


def test_every_quoted_command_parses():
    quoted = list(_quoted_commands())
    assert len(quoted) > 20, "found hardly any quoted gebackend commands: the extraction is broken"
    wrong = [f"{where}: {problem}" for where, word, rest in quoted for problem in _check(word, rest)]
    assert not wrong, "commands quoted in the docs that the CLI refuses:\n" + "\n".join(wrong)


# ---------------------------------------------------------------------------------------------- links and anchors


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"\*+", "", text.replace("`", "")).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen, fence = set(), {}, False
    for line in _lines(path):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence or not re.match(r"#{1,6} ", line):
            continue
        slug = _slug(line.lstrip("#").strip())
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def test_every_link_reaches_its_file_and_anchor():
    broken = []
    for path in ALL_DOCS:
        text, fence = [], False
        for line in _lines(path):  # links in code blocks are no links
            fence ^= line.lstrip().startswith("```")
            text.append("" if fence or line.lstrip().startswith("```") else line)
        text = "\n".join(text)
        for match in re.finditer(r"\]\(([^)\s]+)\)", text):
            target = match.group(1)
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{_rel(path)}:{text.count(chr(10), 0, match.start()) + 1}"
            if not dest.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: {target} (no heading with that anchor in {_rel(dest)})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_anchor_rule_matches_github():
    assert _slug("`--interleave`: every scenario in one server, in rounds") == \
        "--interleave-every-scenario-in-one-server-in-rounds"
    assert _slug("Or the dynamic graph (`bucket_plan=measured`)") == "or-the-dynamic-graph-bucket_planmeasured"
    assert _slug("Lending idle cores (`lend_idle_cores`)") == "lending-idle-cores-lend_idle_cores"


# ---------------------------------------------------------------------------------------------- how the work was done

# Development sessions (numbered, a range of them, "this" or "earlier" ones) and the development machine. ONNX Runtime's own sentences about its InferenceSession ("this session runs on the CPU only",
# "this session's device is gpu:0", "This session cannot use the graph capture ...", "this session has arenas") are
# no development sessions, and neither are bucket sessions, the later sessions of a process, or a shell's session.
_WORK_WORDING = re.compile(
    r"\b[Ss]essions? \d+(?:\s*[-–]\s*\d+)?\b"
    r"|\b(?:[Tt]his|[Ee]arlier|[Pp]revious) (?:development )?sessions?\b"
    r"(?!'s device| runs\b| has\b| cannot\b)"
    r"|\bdevelopment machine\b|\bshared with (?:several )?other (?:developers|builds|jobs|engineers)\b"
)
_SCANNED = re.compile(r"(\.py|\.md|\.sh|\.pbtxt|\.ya?ml|\.toml|/Makefile|^Makefile|/Containerfile|^Containerfile)$|^\.ci/")
_SELF = "tests/unit/test_docs.py"  # this file: the pattern and its examples
_SKIPPED_DIRS = {".venv", ".git", "__pycache__", ".pytest_cache", "build", "dist", "bench/models", "bench/results",
                 "peer-backend", "profiling", "tools/bin", ".gebackend-cache"}


def _tree() -> list[str]:
    """The project's files: those git tracks or would track (not ignored), else a walk that skips generated folders."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.splitlines()
        if out:
            return out
    except (OSError, subprocess.CalledProcessError):
        pass
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT).as_posix()
        if path.is_file() and not any(rel == d or rel.startswith(d + "/") or f"/{d}/" in f"/{rel}"
                                      for d in _SKIPPED_DIRS) and ".egg-info" not in rel:
            found.append(rel)
    return found


def test_the_work_wording_check_can_fail():
    word = "session"  # the numbered examples are built, so that this file names none itself
    for text in (f"measured in {word} 31", f"{word.title()} 36's tune", f"{word}s 34-35", "until this session",
                 "earlier sessions", "on the development machine", "2 cores shared with other jobs"):
        assert _WORK_WORDING.search(text), text
    for text in ("this session runs on the CPU only", "this session's device is gpu:0", "bucket sessions",
                 "This session cannot use the graph capture", "an ONNX Runtime session per bucket",
                 "later sessions here would be refused"):
        assert not _WORK_WORDING.search(text), text


def test_nothing_in_the_tree_speaks_of_how_the_work_was_organised():
    found = []
    for rel in _tree():
        if rel == _SELF or not _SCANNED.search(rel) or not (ROOT / rel).is_file():
            continue
        for number, line in enumerate((ROOT / rel).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for match in _WORK_WORDING.finditer(line):
                found.append(f"{rel}:{number}: {match.group(0)!r} in {line.strip()[:120]!r}")
    assert not found, "wording about how the work was organised (say what the project does, on which machine):\n" + \
        "\n".join(found)
