"""The README and docs/ stay true: every `invoke` task and flag they name exists (as `invoke --list` and
`invoke --help TASK` would show it), and every repository path they name exists."""

import re
from pathlib import Path

import pytest

from dtlab import paths

DOCS = [paths.REPO_ROOT / "README.md", *sorted((paths.REPO_ROOT / "docs").glob("*.md"))]
# The repository's own top-level folders and files: a path in a doc that starts with one of these names a
# file of the checkout (runtime folders such as results/ or .dtlab/ are not checked).
TRACKED_TOP = {entry.name for entry in paths.REPO_ROOT.iterdir()
               if entry.name not in {".git", ".venv", ".dtlab", "results", "__pycache__"}
               and not entry.name.endswith(".egg-info")}
# Files the docs tell a user to create (the real cluster's inventory), or that a command writes.
MADE_BY_THE_USER = {"inventory/cluster.yml"}
# `invoke TASK` and what follows it: flags (with a value), and upper-case placeholders or paths.
INVOKE_CALL = re.compile(r"\binvoke\s+((?:[a-z][\w.-]*)"
                         r"(?:[ \t]+(?:--?[\w-]+(?:[= ][^\s`|]+)?|[A-Z0-9_./<>-]+))*)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def invoke_tasks() -> dict[str, set[str]]:
    """Each task's name (and alias) -> the flags `invoke --help TASK` lists (--no-X for a default-on one)."""
    import tasks

    known = {}
    for name in tasks.ns.task_names:
        task = tasks.ns[name]
        flags = set()
        for argument in task.get_arguments():
            for flag in argument.names:
                flags.add(("--" if len(flag) > 1 else "-") + flag.replace("_", "-"))
            if argument.kind is bool and argument.default is True:
                flags.add(f"--no-{argument.name.replace('_', '-')}")
        known[name] = flags
        for alias in tasks.ns.task_names[name]:
            known[alias] = flags
    return known


def invoke_calls(text: str):
    """(task, [flags]) for each `invoke TASK ...` in code spans and code blocks."""
    blocks = re.findall(r"```.*?\n(.*?)```", text, flags=re.S) + CODE_SPAN.findall(text)
    for block in blocks:
        for line in block.splitlines():
            line = line.split("#", 1)[0]
            for match in INVOKE_CALL.finditer(line):
                words = match.group(1).split()
                for alternative in " ".join(words).split(" | "):  # `invoke lab.up | lab.status | ...`
                    parts = alternative.split()
                    if parts:
                        yield parts[0], [word.split("=")[0] for word in parts[1:] if word.startswith("-")]


def repository_paths(doc: Path, text: str):
    """Paths the doc names: its relative links, and code spans that start with a tracked top-level name."""
    for target in LINK.findall(text):
        if "://" not in target and not target.startswith("mailto:"):
            yield (doc.parent / target).resolve(), target
    for span in CODE_SPAN.findall(text):
        token = span.split()[0] if span.split() else ""
        token = token.rstrip(".,:;)")
        first = token.split("/")[0]
        placeholder = re.search(r"[<>*{}$]|\.\.\.", token) or any(
            re.fullmatch(r"[A-Z_]+", segment) for segment in token.split("/"))  # DIR, NAME: a placeholder
        if "/" in token and first in TRACKED_TOP and not placeholder:
            yield paths.REPO_ROOT / token, token


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_invoke_task_and_flag_the_doc_names_exists(doc):
    known = invoke_tasks()
    wrong = []
    for task, flags in invoke_calls(doc.read_text()):
        if task not in known:
            wrong.append(f"invoke {task}: no such task")
        else:
            wrong += [f"invoke {task} {flag}: no such flag" for flag in flags if flag not in known[task]]
    assert wrong == [], f"{doc.relative_to(paths.REPO_ROOT)}: " + "; ".join(sorted(set(wrong)))


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: doc.name)
def test_every_repository_path_the_doc_names_exists(doc):
    missing = sorted({named for path, named in repository_paths(doc, doc.read_text())
                      if not path.exists() and named not in MADE_BY_THE_USER})
    assert missing == [], f"{doc.relative_to(paths.REPO_ROOT)} names paths that do not exist: {missing}"


def test_the_checks_find_a_wrong_task_flag_and_path():
    text = "Run `invoke bench.al --only ddp`, `invoke test --everything` and see `roles/nope/README.md`."
    known = invoke_tasks()
    calls = list(invoke_calls(text))
    assert ("bench.al", ["--only"]) in calls and "bench.al" not in known
    assert ("test", ["--everything"]) in calls and "--everything" not in known["test"]
    assert "--all" in known["test"] and "--no-lint" in known["test"]
    named = [named for _, named in repository_paths(paths.REPO_ROOT / "README.md", text)]
    assert named == ["roles/nope/README.md"]


def test_the_readme_is_short():
    lines = (paths.REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the rest belongs in docs/"
    assert [n for n, line in enumerate(lines, 1) if len(line) > 120] == []
