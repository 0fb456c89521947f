"""MkDocs hooks (mkdocs.yml `hooks:`), so that every text has one source:

- the committed results under experiments/results/ (Markdown reports and their plots)
  become files of the site at the same paths: a page links to experiments/results/... as
  the repository does, and the site shows the committed files themselves;
- the home page is README.md, its links into docs/ made relative to the site;
- results.md, the index of every committed report (`results_index`), is generated at
  each build from the files themselves, so it cannot miss one.
"""

import pathlib
import re

from mkdocs.structure import files as mkfiles

KINDS = (".md", ".png", ".svg")


def results_index(root: pathlib.Path) -> str:
  """A page listing every report under experiments/results/ by folder, each by its title
  (its first "# " line)."""
  results = root / "experiments" / "results"
  lines = [
    "# Every committed result",
    "",
    "Generated when the site is built (`docs/hooks.py`) from the reports committed under",
    "`experiments/results/`: each links to the report itself, with its date, machine and",
    "the command that made it.",
  ]
  folder = None
  for path in sorted(results.rglob("*.md")):
    here = path.parent.relative_to(results).as_posix()
    if here != folder:
      lines += ["", f"## {here}", ""]
      folder = here
    heads = [x[2:].strip() for x in path.read_text().splitlines() if x.startswith("# ")]
    title = heads[0] if heads else path.stem
    lines.append(f"- [{title}]({path.relative_to(root).as_posix()})")
  return "\n".join(lines) + "\n"


def on_files(files, config):
  root = pathlib.Path(config["config_file_path"]).parent
  files.append(mkfiles.File.generated(config, "results.md", content=results_index(root)))
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
