"""Generated markdown files with several parts, each written by its own command: a part sits between
`<!-- name -->` and `<!-- /name -->` and is replaced in place, leaving the others as they are."""

from __future__ import annotations

from pathlib import Path


def check_section(path: Path, name: str) -> str:
    """The text of `path` ("" when it does not exist yet) if part `name` can be written into it; else the error a
    measuring command gives before it measures, not after: a folder, a file it cannot read, or markers of that part
    that are not one begin and then one end (an edit lost one: replacing from the first begin to some end could
    take other parts with it)."""
    path = Path(path)
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    if path.is_dir():
        raise SystemExit(f"error: {path} is a folder: give the markdown file to write part '{name}' into")
    try:
        old = path.read_text() if path.exists() else ""
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"error: {path}: cannot read it ({e})") from None
    counts = (old.count(begin), old.count(end))
    if counts not in ((0, 0), (1, 1)) or (counts == (1, 1) and old.index(end) < old.index(begin)):
        raise SystemExit(f"error: {path}: part '{name}' has {counts[0]} '{begin}' and {counts[1]} '{end}' markers "
                         "(one of each, in that order, expected): mend the file by hand, then write the part again")
    return old


def write_section(path: Path, name: str, text: str) -> None:
    """Replace part `name` of `path` (or append it); `check_section`'s errors first."""
    begin, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    block = f"{begin}\n{text.strip()}\n{end}\n"
    old = check_section(path, name)
    counts = (old.count(begin), old.count(end))
    if counts == (1, 1):
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):].lstrip("\n")
    else:
        new = (old.rstrip() + "\n\n" if old.strip() else "") + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
