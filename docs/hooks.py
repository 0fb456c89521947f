"""MkDocs hooks (mkdocs.yml `hooks:`), so that every text has one source:

- the committed results under experiments/results/ (Markdown reports and their plots)
  become files of the site at the same paths: a page links to experiments/results/... as
  the repository does, and the site shows the committed files themselves;
- the home page is README.md, its links into docs/ made relative to the site.
"""

import pathlib
import re

from mkdocs.structure import files as mkfiles

KINDS = (".md", ".png", ".svg")


def on_files(files, config):
  root = pathlib.Path(config["config_file_path"]).parent
  for path in sorted((root / "experiments" / "results").rglob("*")):
    if path.suffix in KINDS:
      files.append(
        mkfiles.File(
          path.relative_to(root).as_posix(),
          src_dir=str(root),
          dest_dir=config["site_dir"],
          use_directory_urls=config["use_directory_urls"],
        )
      )
  return files


def on_page_markdown(markdown, page, config, files):
  if page.file.src_uri != "index.md":
    return markdown
  root = pathlib.Path(config["config_file_path"]).parent
  readme = (root / "README.md").read_text()
  return re.sub(r"\]\(docs/", "](", readme)
