"""Reading what programs print: `key=value` lines, and the `key value` lines of the programs
that predate them (tests/c/overlap.c, crates/gpupool-lab/benches/threads.rs)."""

import re

# A word of a key=value line; values hold no spaces, so a line splits on white space.
_PAIR = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")


def records(text):
    """One dict per line made only of key=value words, in the order printed. Other lines (a
    log's command line, the pool's summary, error messages) are not records."""
    out = []
    for line in text.splitlines():
        words = line.split()
        pairs = [_PAIR.match(w) for w in words]
        if words and all(pairs):
            out.append({m.group(1): m.group(2) for m in pairs})
    return out


def first(recs, key, default=None):
    """The value of `key` in the first record that has it."""
    for r in recs:
        if key in r:
            return r[key]
    return default


def rows(recs, *keys):
    """The records that have every one of `keys` (a program's per-size or per-round lines)."""
    return [r for r in recs if all(k in r for k in keys)]


def words(text, key):
    """The word after `key` on the first line whose first word is `key`, or None."""
    for line in text.splitlines():
        w = line.split()
        if len(w) >= 2 and w[0] == key:
            return w[1]
    return None
