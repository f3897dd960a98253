"""The API reference's build hooks (make docs builds the site in strict mode in make test): the README,
changelog and notebooks become pages, and a public name without a docstring fails the build."""

import importlib.util
import logging
import pathlib

import stopgrad_math

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
    assert len(notebooks) == 4 and set(pages) == {"README.md", "CHANGELOG.md", *notebooks}
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
