"""The API reference's build hooks (make docs builds the site in strict mode in make test): the README,
changelog and notebooks become pages, and a public name without a docstring fails the build."""

import ast
import importlib.util
import logging
import pathlib
import re

import numpy as np
import pytest

import stopgrad_math

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_changelog_and_every_notebook_become_pages(tmp_path):
    from mkdocs.config import load_config
    from mkdocs.structure.files import Files

    config = load_config(str(ROOT / "mkdocs.yml"), site_dir=str(tmp_path))
    files = _hooks().on_files(Files([]), config)
    pages = {f.src_uri: f.url for f in files}
    notebooks = sorted(f"notebooks/{p.name}" for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert len(notebooks) == 6 and set(pages) == {"README.md", "CHANGELOG.md", *notebooks}
    assert pages["README.md"] == "./"  # the front page


def test_a_public_name_without_a_docstring_fails_the_strict_build(monkeypatch, caplog):
    def undocumented():
        pass

    monkeypatch.setattr(stopgrad_math, "undocumented", undocumented, raising=False)
    monkeypatch.setattr(stopgrad_math, "__all__", [*stopgrad_math.__all__, "undocumented"])
    with caplog.at_level(logging.WARNING, logger="mkdocs"):
        _hooks().on_pre_build(config=None)
    assert [r.getMessage() for r in caplog.records] == [
        "stopgrad_math.undocumented has no docstring: every public name needs one."
    ]
    assert caplog.records[0].name.startswith("mkdocs.")  # mkdocs --strict counts its loggers' warnings


def test_the_readmes_links_into_docs_are_made_relative_to_the_site_and_no_other_pages():
    from types import SimpleNamespace

    def page(src_uri):
        return SimpleNamespace(file=SimpleNamespace(src_uri=src_uri))

    markdown = "[TensorFlow](docs/tensorflow.md), [a notebook](notebooks/log1pexp.ipynb)"
    hooks = _hooks()
    readme = hooks.on_page_markdown(markdown, page("README.md"), config=None, files=None)
    assert readme == "[TensorFlow](tensorflow.md), [a notebook](notebooks/log1pexp.ipynb)"
    assert hooks.on_page_markdown(markdown, page("jax.md"), config=None, files=None) == markdown
    for target in ("tensorflow.md", "jax.md", "torch.md", "speed.md", "architecture.md", "reference.md",
                   "custom_gradient.md"):
        assert f"](docs/{target}" in (ROOT / "README.md").read_text() and (ROOT / "docs" / target).exists()


def _python_blocks(text):
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


@pytest.mark.parametrize("block", range(len(_python_blocks((ROOT / "README.md").read_text()))))
def test_each_readme_example_runs_and_its_last_line_gives_the_numbers_its_comment_states(block):
    """The front page's examples, run as a reader would paste them: the last line's value against the list in its
    comment (rounded to two decimals there), the true derivatives of log1pexp."""
    source = _python_blocks((ROOT / "README.md").read_text())[block]
    *body, last = ast.parse(source).body
    namespace = {}
    exec(compile(ast.Module(body, type_ignores=[]), "README.md", "exec"), namespace)
    got = np.asarray(eval(compile(ast.Expression(last.value), "README.md", "eval"), namespace))
    stated = re.search(r"#\s*\[([^\]]*)\]", source.rstrip().splitlines()[-1]).group(1)
    np.testing.assert_allclose(got, [float(v) for v in stated.split(",")], atol=0.006)
