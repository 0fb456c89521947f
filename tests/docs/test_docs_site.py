"""The documentation site (mkdocs.yml, docs/) builds in strict mode, so a broken link, a
missing page or an API reference that does not resolve fails the suite; every page is in
its navigation, every package module in its API reference, and the home page is the
README."""

import os
import subprocess
import sys

import yaml

from tests import manual

ROOT = manual.ROOT
GENERATED = {"results.md"}  # Pages docs/hooks.py makes at each build.


def _nav_pages(nav) -> list[str]:
  out = []
  for entry in nav:
    value = next(iter(entry.values())) if isinstance(entry, dict) else entry
    out += _nav_pages(value) if isinstance(value, list) else [value]
  return out


def _config() -> dict:
  class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python tags; none are read here.
    pass

  Loader.add_multi_constructor("", lambda loader, tag, node: None)
  return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)


def test_every_page_is_in_the_navigation_and_every_module_in_the_reference():
  config = _config()
  listed = set(_nav_pages(config["nav"])) - GENERATED
  pages = {p.relative_to(manual.DOCS).as_posix() for p in manual.DOCS.rglob("*.md")}
  assert pages == listed, (sorted(pages - listed), sorted(listed - pages))
  reference = "".join(p.read_text() for p in (manual.DOCS / "reference").glob("*.md"))
  for path in (ROOT / "grpo_jax").rglob("*.py"):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    assert f"::: {module}\n" in reference, f"docs/reference lacks {module}"


def test_the_site_builds_in_strict_mode(tmp_path):
  """`mkdocs build --strict`: every link between pages, every anchor and every API
  reference resolves; the committed results are pages of the site (docs/hooks.py), and
  the home page is the README's text with its docs/ links made relative."""
  env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
  site = tmp_path / "site"
  r = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
    cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert r.returncode == 0, r.stderr[-4000:]
  home = (site / "index.html").read_text()
  assert "Install and run the default demo" in home and 'href="training/"' in home
  assert "docs/training.md" not in home
  assert (site / "quickstart" / "index.html").read_text().count("grpo_demo") >= 1
  assert (site / "experiments" / "results" / "reproductions" / "flips" / "index.html").exists()
  assert (site / "experiments" / "results" / "reproductions" / "flips.png").exists()
  index = (site / "results" / "index.html").read_text()
  reports = sorted((ROOT / "experiments" / "results").rglob("*.md"))
  assert index.count("<li>") >= len(reports) and "Calculator episodes as a verifiers" in index
  rl = (site / "reference" / "rl" / "index.html").read_text()
  assert "grpo_jax.rl.advantages" in rl and "distill" in rl
