"""The documentation: the site builds with warnings as errors (broken links and anchors, pages
missing from the navigation, unresolved API references, missing included files all fail it),
every Python block in the docs and the README parses, and the README's commands are the ones
CI runs."""

import ast
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")


def _markdown_files():
    pages = [os.path.join(DOCS, f) for f in sorted(os.listdir(DOCS)) if f.endswith(".md")]
    pages += [os.path.join(DOCS, "api", f) for f in sorted(os.listdir(os.path.join(DOCS, "api")))]
    return pages + [os.path.join(ROOT, "README.md")]


def _blocks(path, language):
    """The fenced code blocks of ``language`` in a Markdown file."""
    text = open(path).read()
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def test_site_builds_without_warnings(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs tools are in the 'docs' and 'test' extras (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs tools are in the 'docs' and 'test' extras")
    site = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    getting_started = (site / "getting-started" / "index.html").read_text()
    assert "_all_reduce_kernel" in getting_started, "examples/05 is not included in getting-started"
    api = (site / "api" / "core" / "index.html").read_text()
    assert "iris_fw.context.init" in api and "heap_size" in api, "the API reference lost init()"
    assert ":class:" not in api and ":func:" not in api, "Sphinx roles leak into the API reference"
    for page in ("programming-model", "plugins", "troubleshooting", "environment", "inference", "taxonomy",
                 "collectives", "iris-compat", "api/ccl", "api/ops", "api/device", "api/plugins", "api/tools"):
        assert (site / page / "index.html").exists(), page


def test_python_blocks_parse():
    bad = []
    for path in _markdown_files():
        for block in _blocks(path, "python"):
            if "--8<--" in block:
                continue  # an included file: the examples' own tests run it
            try:
                ast.parse(block)
            except SyntaxError as exc:
                bad.append(f"{os.path.relpath(path, ROOT)}: {exc}")
    assert not bad, bad


def test_readme_test_command_is_what_ci_runs():
    ci = [line.strip() for line in open(os.path.join(ROOT, ".ci", "run")) if "pytest" in line]
    assert len(ci) == 1, ci
    readme = [line.split("#")[0].strip() for block in _blocks(os.path.join(ROOT, "README.md"), "bash")
              for line in block.splitlines() if "pytest" in line and "-m pytest" in line]
    assert ci[0] in readme, f".ci/run runs {ci[0]!r}; the README says {readme}"
    # the getting-started page gives the same command
    started = [line.split("#")[0].strip() for block in _blocks(os.path.join(DOCS, "getting-started.md"), "bash")
               for line in block.splitlines() if "-m pytest" in line]
    assert ci[0] in started, started


def test_readme_and_docs_name_existing_files():
    """Every examples/…, scripts/… or docs/… path a command or link of the README and the docs
    names exists."""
    missing = []
    for path in _markdown_files():
        for name in re.findall(r"\b((?:examples|scripts|docs)/[\w./-]*\w)", open(path).read()):
            if not os.path.exists(os.path.join(ROOT, name)) and not name.startswith("docs/results/"):
                missing.append(f"{os.path.relpath(path, ROOT)}: {name}")
    assert not missing, missing
