"""Generated markdown files with several parts, each written by its own command: a part sits between
`<!-- name -->` and `<!-- /name -->` and is replaced in place, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, text: str) -> None:
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):].lstrip("\n")
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
