#!/usr/bin/env python3
"""Holds README.md's results table to the committed results files: every figure (a number, or a
fraction such as 1/18) in a cell of the table under "## Results at a glance" must occur, as that
number, in the results file the same cell links to (a path under benches/results/); a cell with a
figure and no such link fails, and so does a missing file or a plot the section shows that is not
there. Link texts (machine, date) are not checked. Exit 0 when all hold, 1 with each failure
named otherwise. Run: python3 scripts/check-readme-figures.py [README.md]"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Results at a glance"
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:/\d+)?")


def section(text):
    start = text.find("\n" + SECTION + "\n")
    if start < 0:
        return None
    rest = text[start + len(SECTION) + 2:]
    end = rest.find("\n## ")
    return rest if end < 0 else rest[:end]


def occurs(figure, text):
    return re.search(r"(?<![\d.])" + re.escape(figure) + r"(?![\d]|\.\d)", text) is not None


def check(readme):
    failures = []
    with open(readme, encoding="utf-8") as f:
        body = section(f.read())
    if body is None:
        return [f"{readme}: no '{SECTION}' section"]
    rows = [l for l in body.splitlines() if l.startswith("|")]
    if len(rows) < 3:
        return [f"{readme}: no results table under '{SECTION}'"]
    base = os.path.dirname(os.path.abspath(readme))
    checked = 0
    for row in rows[2:]:  # header and separator
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        for cell in cells:
            links = [(t, p) for t, p in LINK.findall(cell) if p.startswith("benches/results/")]
            figures = FIGURE.findall(LINK.sub(" ", cell))
            if not figures:
                continue
            if not links:
                failures.append(f"figures {figures} with no results link: {cell!r}")
                continue
            texts = []
            for _, path in links:
                full = os.path.join(base, path)
                if not os.path.isfile(full):
                    failures.append(f"{path}: linked from the table, not a file")
                    continue
                with open(full, encoding="utf-8") as f:
                    texts.append(f.read())
            for fig in figures:
                checked += 1
                if texts and not any(occurs(fig, t) for t in texts):
                    failures.append(f"{fig} not in {', '.join(p for _, p in links)}: {cell!r}")
    for _, path in re.findall(r"!\[([^\]]*)\]\(([^)\s]+)\)", body):
        if not os.path.isfile(os.path.join(base, path)):
            failures.append(f"{path}: plot shown in the section, not a file")
    if not checked:
        failures.append("the table shows no figure")
    return failures


def main():
    readme = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "README.md")
    failures = check(readme)
    for f in failures:
        print(f"check-readme-figures: {f}", file=sys.stderr)
    if not failures:
        print(f"check-readme-figures: every figure of {os.path.basename(readme)}'s table is in its results file")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
