"""Sphinx extension: repository and launch buttons only when the course names a real repository.

The one setting is `repository.url` in `_config.yml`. Empty (the default), the book shows no
repository, Binder or Colab button, so no page links to a repository that does not exist.
Set to `https://github.com/ORG/REPO` (or GitLab), the repository button and the launch buttons
configured under `launch_buttons` appear, and `scripts/repository.py set URL` writes the same
URL into the first cell of every chapter, which installs the library when it runs in Colab.
"""
from __future__ import annotations

import re

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError

REPOSITORY_URL = re.compile(r"https://(github\.com|gitlab\.com)/[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")


def repository_buttons(app: Sphinx, config: Config) -> None:
    """Turn the repository and launch buttons on or off from `repository_url` alone."""
    opts = config.html_theme_options
    url = opts.get("repository_url", "")
    if url and not REPOSITORY_URL.fullmatch(url):
        raise ConfigError(f"_config.yml repository.url: expected https://github.com/ORG/REPO "
                          f"(or gitlab.com) or empty, got {url!r}")
    opts["use_repository_button"] = bool(url)
    if not url:
        opts.pop("launch_buttons", None)
        opts.pop("repository_url", None)


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", repository_buttons)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
