"""The manual (docs/, mkdocs.yml): it builds under `mkdocs build --strict` with no warning, its
code-layout page is written from the tree (docs/hooks/code_layout.py) so it cannot drift, and the
README stays short and links only to pages that exist."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def code_layout():
    spec = importlib.util.spec_from_file_location("code_layout", REPO / "docs" / "hooks" / "code_layout.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_layout_page_lists_every_package_and_module_of_the_tree():
    warnings: list[str] = []
    page = code_layout().render(REPO, warn=warnings.append)
    assert warnings == []  # every package says what it holds
    package_root = REPO / "rocmport"
    for init in package_root.rglob("__init__.py"):
        if init.parent != package_root:
            assert f"`{init.parent.relative_to(REPO).as_posix()}/`" in page
    for module in package_root.rglob("*.py"):
        if module.name != "__init__.py":
            package = module.parent.relative_to(REPO).as_posix()
            heading = "## Top-level modules" if module.parent == package_root else f"# `{package}/`"
            assert f"| `{module.stem}` |" in section(page, heading), module


def section(page: str, heading: str) -> str:
    """The page's text from the line holding ``heading`` to the next heading."""
    start = page.index(heading)
    following = re.search(r"^#", page[start + len(heading) :], re.M)
    return page[start : start + len(heading) + following.start()] if following else page[start:]


def test_the_layout_follows_the_architecture_test_s_order():
    """The packages appear in the order tests/test_architecture.py enforces, and the rule names it."""
    layout = code_layout()
    order = [p for p in layout.pipeline(REPO) if p and (REPO / "rocmport" / p).is_dir()]
    page = layout.render(REPO)
    positions = [page.index(f"## `rocmport/{p}/`") for p in order]
    assert positions == sorted(positions) and len(order) >= 10
    assert ", ".join(f"`{p}`" for p in order) in page


def test_a_new_module_shows_up_and_a_package_without_a_docstring_is_named(tmp_path):
    """A toy tree: the page follows what is there (a module moved into a new subpackage appears
    under it, with its docstring), and a package that says nothing is a warning naming its file."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_architecture.py").write_text('PIPELINE = ["", "alpha", "beta", "commands", "cli"]\n')
    for rel, text in {
        "rocmport/__init__.py": '"""toy."""\n',
        "rocmport/cli.py": '"""The command line. More words here."""\n',
        "rocmport/beta/__init__.py": '"""Beta: the second layer."""\n',
        "rocmport/beta/runtime/__init__.py": "",
        "rocmport/beta/runtime/protocol.py": '"""Each variable once, with <its> | type."""\n',
        "rocmport/alpha/__init__.py": '"""Alpha: the first layer."""\n',
        "rocmport/alpha/one.py": "X = 1\n",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    warnings: list[str] = []
    page = code_layout().render(tmp_path, warn=warnings.append)
    assert warnings == [
        "rocmport/beta/runtime/__init__.py has no docstring: say what the package holds (the code-layout page shows it)"
    ]
    assert (
        page.index("## `rocmport/alpha/`")
        < page.index("## `rocmport/beta/`")
        < page.index("### `rocmport/beta/runtime/`")
    )
    assert "| `protocol` | Each variable once, with &lt;its&gt; \\| type. |" in page
    assert "| `one` | — |" in page and "| `cli` | The command line. |" in page


def test_the_readme_is_short_and_links_only_to_pages_that_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert len(links) > 10 and [link for link in links if not (REPO / link).is_file()] == []


def test_the_readme_keeps_its_two_commands():
    """The set-up block CI and people run as written: one install-and-run line, one test line."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Set up and run (fresh machine)", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2
    assert "rocmport sync --ref v0.16 --source pypi && rocmport apply" in commands[0]
    assert commands[1].endswith("python -m pytest -q -n 2")


def test_every_page_in_the_nav_exists_and_every_page_is_in_the_nav():
    """mkdocs reports a page missing from the nav only as information: this test makes it a failure,
    so no moved text is left out of the built manual."""
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    in_nav = set(pages(config["nav"]))
    docs = REPO / "docs"
    on_disk = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md") if "hooks" not in p.parts}
    assert sorted(in_nav - on_disk) == []
    assert sorted(on_disk - in_nav) == []


def test_the_manual_builds_strict_with_no_warning(tmp_path):
    """What CI runs (.ci/run), into a temporary site: a broken link or anchor, a page the nav names
    that is missing, or a package without a docstring fails it."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra: pip install -e '.[docs]')")
    site = tmp_path / "site"
    # Where a build writes by default (mkdocs.yml's site_dir, mkdocs' own default): left as they were.
    defaults = [REPO / "build" / "docs", REPO / "site"]
    before = [(p.exists(), p.stat().st_mtime_ns if p.exists() else 0) for p in defaults]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(REPO / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    layout = (site / "code-layout" / "index.html").read_text(encoding="utf-8")
    for init in (REPO / "rocmport").rglob("__init__.py"):
        if init.parent != REPO / "rocmport":
            assert f"<code>{init.parent.relative_to(REPO).as_posix()}/</code>" in layout
    for module in (REPO / "rocmport").rglob("*.py"):
        assert module.name == "__init__.py" or f"<td><code>{module.stem}</code></td>" in layout
    assert "<!-- code-layout" not in layout
    assert [(p.exists(), p.stat().st_mtime_ns if p.exists() else 0) for p in defaults] == before


def test_the_docs_hook_is_plain_python():
    """The hook imports nothing from mkdocs (the tests above run it without mkdocs installed)."""
    tree = ast.parse((REPO / "docs" / "hooks" / "code_layout.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "mkdocs" not in imported
