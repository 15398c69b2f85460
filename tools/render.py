"""The one Markdown renderer of the tools: tables, code blocks, number formats, and the marked
sections of a document that a tool rewrites."""

import re


def table(columns, rows):
    """A Markdown table. `columns`: (header, align) pairs, align "l" or "r"; `rows`: lists of
    cells (None shows as nothing). A '|' inside a cell is escaped."""

    def cell(v):
        return "" if v is None else str(v).replace("|", "\\|")

    lines = [
        "| " + " | ".join(h for h, _ in columns) + " |",
        "| " + " | ".join("---:" if a == "r" else "---" for _, a in columns) + " |",
    ]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def code(lines):
    """A fenced code block of `lines`."""
    return "\n".join(["```", *lines, "```"])


def thousands(n):
    """An integer with its digits grouped by three with spaces: 100000 -> "100 000"."""
    s = str(n)
    return re.sub(r"\B(?=(\d{3})+$)", " ", s)


def fixed(x, digits):
    """`x` with `digits` decimals, as printf's %.Nf writes it."""
    return f"{float(x):.{digits}f}"


def ratio(a, b, digits=1):
    """a / b with `digits` decimals."""
    return fixed(float(a) / float(b), digits)


def replace_section(doc, name, body):
    """`doc` with the lines between `<!-- NAME:begin -->` and `<!-- NAME:end -->` replaced by
    `body` (with a blank line on each side); the markers are appended when missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    lines = doc.split("\n")
    if begin not in lines or end not in lines:
        doc = doc.rstrip("\n") + f"\n\n{begin}\n{end}\n"
        lines = doc.split("\n")
    i, j = lines.index(begin), lines.index(end)
    return "\n".join(lines[: i + 1] + ["", body.rstrip("\n"), ""] + lines[j:])
