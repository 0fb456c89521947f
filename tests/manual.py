"""The manual as the tests read it: README.md (the start) and the documentation site's
pages (docs/*.md, built by mkdocs.yml). Every command and code block in any of them is
checked by the tests that read them here (test_readme, test_docs, test_docs_site)."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[pathlib.Path]:
  """README.md, then every page of the site (docs/, sub-folders included)."""
  return [README, *sorted(DOCS.rglob("*.md"))]


def text() -> str:
  """Every page's text, README first, one after the other."""
  return "\n\n".join(p.read_text() for p in pages())


def page(name: str) -> str:
  """One page of the site (a path under docs/)."""
  return (DOCS / name).read_text()
