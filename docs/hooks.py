"""mkdocs hooks: the README (the front page), the changelog and the notebooks are pages read from where they
live in the repository; the README's links into docs/ are made relative to the site; every public name must have
a docstring."""

import inspect
import logging
import pathlib

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = pathlib.Path(__file__).resolve().parent.parent
log = logging.getLogger("mkdocs.hooks.stopgrad_math")


@event_priority(100)  # before mkdocs-jupyter, which makes the notebooks pages
def on_files(files, config):
    # mkdocs serves a README.md as its folder's index page.
    sources = ["README.md", "CHANGELOG.md", *(p.relative_to(ROOT).as_posix() for p in ROOT.glob("notebooks/*.ipynb"))]
    for source in sources:
        files.append(File(source, str(ROOT), config.site_dir, config.use_directory_urls))
    return files


def on_page_markdown(markdown, page, config, files):
    # On GitHub the README links to docs/tensorflow.md; in the site the README and docs/'s pages share one root.
    if page.file.src_uri == "README.md":
        return markdown.replace("](docs/", "](")
    return markdown


def on_pre_build(config):
    import stopgrad_math  # here, not at the top: the frameworks load only when the docs are built
    import stopgrad_math.jax
    import stopgrad_math.torch

    for namespace in (stopgrad_math, stopgrad_math.jax, stopgrad_math.torch):
        for name in namespace.__all__:
            if not inspect.getdoc(getattr(namespace, name)):  # fails --strict
                log.warning("%s.%s has no docstring: every public name needs one.", namespace.__name__, name)
