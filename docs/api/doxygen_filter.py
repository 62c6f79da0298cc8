#!/usr/bin/env python3
"""Doxygen INPUT_FILTER for capi/include/kfuse.h: makes the header's plain comments Doxygen's,
without changing the header (it stays plain C comments, as its style guide wants).

    /* text */ before a declaration       ->  /** text */    (documents the declaration)
    decl; /* text */  (a trailing comment)  ->  decl; /**< text */
    the file's opening comment              ->  /** @file ... */
    /* ---- section ---- */ separators      stay plain comments

A comment before a run of declarations with no blank line between them (e.g. two functions with
one contract) documents each of them: it is repeated, on one line, before every declaration of
the run after the first. A declaration of several names (`int32_t kernel_h, kernel_w; /* .. */`)
is split into one declaration per name, each with the trailing comment. A plain comment that is
followed by a line with a trailing comment of its own (the "appended in later versions" notes
inside structs) stays plain. Lines are never added or removed, so Doxygen's warnings point at
the header's own lines.

Usage (Doxygen calls it): doxygen_filter.py FILE  -> the filtered text on stdout.
"""
import re
import sys

SEPARATOR = re.compile(r"^\s*/\* ----")
# a line that starts a declaration at column 0 (a run of them shares the comment above)
DECL_START = re.compile(r"^(KF_API\b|#define\b|typedef\b)")
# `type a, b, c;` followed by a trailing comment: a struct field declaring several names
MULTI_FIELD = re.compile(r"^(\s+)([A-Za-z_][\w ]*?\s)(\w+(?:\s*,\s*\w+)+)\s*;\s*/\*(.*)$")


def comment_end(lines, i):
    """Index of the line where the comment opened on line i closes."""
    j = i
    while "*/" not in lines[j]:
        j += 1
    return j


def trailing_comment_pos(line):
    """Position of a `/*` that follows code on the line, or -1."""
    pos = line.find("/*")
    if pos <= 0 or not line[:pos].strip() or line[:pos].strip().startswith("*"):
        return -1
    return pos


def documents(nxt):
    """Whether a comment on lines of its own documents the line `nxt` that follows it: a
    declaration, unless it is a field or value with a trailing comment of its own."""
    if not nxt.strip() or nxt.strip().startswith(("}", "/*", "#if", "#endif")):
        return False
    return bool(DECL_START.match(nxt)) or trailing_comment_pos(nxt) < 0


def one_line(block):
    """A comment block's text joined onto one line, as `/** ... */`."""
    text = " ".join(l.strip().lstrip("/*").rstrip("*/").strip() for l in block)
    return "/** " + " ".join(text.split()) + " */ "


def filter_header(lines):
    out = list(lines)
    n = len(lines)
    i = 0
    while i < n:
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("/*"):  # a comment on lines of its own
            j = comment_end(lines, i)
            if i == 0:
                out[i] = line.replace("/*", "/** @file kfuse.h", 1)
            elif not SEPARATOR.match(line) and j + 1 < n:
                if documents(lines[j + 1]):
                    out[i] = line.replace("/*", "/**", 1)
                    # repeat the comment before the run's other declarations (a struct's body
                    # ends the run: what follows it is not the struct)
                    single = one_line(lines[i:j + 1])
                    k = j + 2
                    while k < n and lines[k].strip() and not lines[k].lstrip().startswith(
                            ("/*", "}")):
                        if DECL_START.match(lines[k]):
                            out[k] = single + lines[k]
                        k += 1
            i = j + 1
            continue
        pos = trailing_comment_pos(line)
        if pos >= 0:
            m = MULTI_FIELD.match(line)
            if m:
                indent, typ, names, rest = m.groups()
                decls = " ".join("%s%s; /**<%s" % (typ, name.strip(), rest)
                                 for name in names.split(","))
                out[i] = indent + decls
            else:
                out[i] = line[:pos] + "/**<" + line[pos + 2:]
            # continuation lines of a multi-line trailing comment need nothing
            if "*/" not in line[pos:]:
                i = comment_end(lines, i)
        i += 1
    return out


def escape_html_like(lines):
    """`<NAME>` in a comment (libkfuse.so.<KF_ABI_VERSION>) is text to the header, an unknown
    HTML tag to Doxygen: escape a `<` before a letter inside comments (not `/**<`, not code)."""
    out, inside = [], False
    for line in lines:
        chars, i = [], 0
        while i < len(line):
            if not inside and line.startswith("/*", i):
                inside = True
                m = re.match(r"/\*\*?<?", line[i:])
                chars.append(m.group(0))
                i += len(m.group(0))
                continue
            if inside and line.startswith("*/", i):
                inside = False
                chars.append("*/")
                i += 2
                continue
            c = line[i]
            if inside and c == "<" and line[i + 1:i + 2].isalpha():
                c = "\\<"
            chars.append(c)
            i += 1
        out.append("".join(chars))
    return out


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        lines = f.read().split("\n")
    sys.stdout.write("\n".join(escape_html_like(filter_header(lines))))


if __name__ == "__main__":
    main()
