"""Per-run rollout statistics of MBRCSL runs, as a markdown table: how many rollouts the model made, how
many passed the threshold, and their returns (from each run's final.json).

    python -m benchmarks.rollout_counts runs-bench/mbrcsl-maze >> results/mbrcsl-stitching.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = (("rollouts/threshold", "threshold", "{:.1f}"), ("rollouts/epochs", "epochs", "{:d}"),
           ("rollouts/made", "made", "{:d}"), ("rollouts/kept", "kept", "{:d}"),
           ("rollouts/return_mean", "return mean (all)", "{:.1f}"), ("rollouts/return_max", "return max (all)", "{:.1f}"),
           ("rollouts/kept_return_mean", "kept return mean", "{:.1f}"), ("target_return", "RCSL target", "{:.1f}"),
           ("rcsl_steps", "RCSL steps", "{:d}"))


def rows(roots: list[Path]) -> list[dict]:
    found = []
    for root in roots:
        for final_path in sorted(root.glob("**/mbrcsl/*/*/final.json")):
            try:
                final = json.loads(final_path.read_text())
                final["dataset"], final["seed"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                from benchmarks.table import damaged_records

                raise damaged_records(final_path.parent, e) from None
            variant = final_path.parents[3].name  # <root>/<variant>/mbrcsl/<dataset>/<seed>-sweep/final.json
            found.append({"variant": variant, **final})
    return sorted(found, key=lambda r: (r["dataset"], r["variant"], r["seed"]))


def markdown(found: list[dict]) -> str:
    head = "| variant | dataset | seed | " + " | ".join(name for _, name, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (3 + len(COLUMNS))]
    for r in found:
        cells = []
        for key, _, fmt in COLUMNS:
            value = r.get(key)
            cells.append("-" if value is None else fmt.format(int(value) if fmt == "{:d}" else float(value)))
        lines.append(f"| {r['variant']} | {r['dataset']} | {r['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="+", type=Path, help="sweep folders holding mbrcsl runs")
    roots = parser.parse_args(argv).roots
    missing = [str(root) for root in roots if not root.is_dir()]
    if missing:  # the table is meant to be appended to a results file: an empty one would land there
        parser.error(f"no such sweep folder: {', '.join(missing)}")
    found = rows(roots)
    if not found:
        parser.error(f"no finished MBRCSL run under {', '.join(map(str, roots))}")
    text = markdown(found)
    print(text, end="")
    return text


if __name__ == "__main__":
    main()
