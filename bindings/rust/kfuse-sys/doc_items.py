#!/usr/bin/env python3
"""generate.sh's last step: gives bindgen's output (the file named, rewritten in place) the doc
comments bindgen cannot carry over from kfuse.h, so that every public item of kfuse-sys is
documented (bindgen copies the comments of functions, structs, fields and enum values itself):

- `pub const KF_*`, a macro (bindgen keeps no macro comment): the comment of its #define, the
  one trailing on its line (with the lines it continues on), else the comment right above it (a
  comment above a run of #defines serves each of them);
- `pub struct kf_*` of an opaque handle: the comment above its `typedef struct kf_x kf_x;`;
- `pub type __*`, glibc's integer types, which bindgen emits for stdint.h's: said so.

Usage: doc_items.py HEADER BINDINGS_RS
"""
import re
import sys


def comment_text(block):
    """The text of a C comment's lines, joined: the markers and each line's leading star
    stripped (a `*` inside the text, a product, stays)."""
    parts = []
    for line in block:
        line = re.sub(r"\*+/$", "", re.sub(r"^/\*+", "", line.strip()))
        parts.append(re.sub(r"^\*(?=\s|$)", "", line.strip()))
    return " ".join(" ".join(parts).split())


def header_docs(header_lines):
    """{name: text} for the header's KF_* macros and opaque kf_* handles."""
    docs, above, i = {}, None, 0
    while i < len(header_lines):
        line = header_lines[i]
        stripped = line.strip()
        if stripped.startswith("/*"):  # a comment on lines of its own
            block = [line]
            while "*/" not in header_lines[i]:
                i += 1
                block.append(header_lines[i])
            above = None if stripped.startswith("/* ----") else comment_text(block)
        elif not stripped:
            above = None
        else:
            define = re.match(r"#define (KF_\w+)\s+[^/]*(/\*.*)?$", line)
            opaque = re.match(r"typedef struct (kf_\w+) \1;", line)
            if define and define.group(2):
                block = [define.group(2)]
                while "*/" not in header_lines[i]:
                    i += 1
                    block.append(header_lines[i])
                docs[define.group(1)] = comment_text(block)
            elif (define or opaque) and above:
                docs[(define or opaque).group(1)] = above
        i += 1
    return docs


def doc_attr(text):
    return '#[doc = " %s"]' % text.replace("\\", "\\\\").replace('"', '\\"')


def main():
    header, path = sys.argv[1], sys.argv[2]
    with open(header, encoding="utf-8") as f:
        docs = header_docs(f.read().split("\n"))
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    for i, line in enumerate(lines):
        documented = i > 0 and lines[i - 1].lstrip().startswith("#[doc")
        const = re.match(r"pub const (KF_\w+):", line)
        alias = re.match(r"pub type (__\w+) =", line)
        opaque = re.match(r"pub struct (kf_\w+) \{", line)
        if const and not documented:
            if const.group(1) not in docs:
                sys.exit("doc_items.py: #define %s in kfuse.h has no comment (kfuse-sys denies "
                         "missing_docs): give it one, trailing or on the line above"
                         % const.group(1))
            out.append(doc_attr(docs[const.group(1)]))
        elif alias and not documented:
            out.append(doc_attr("glibc's `%s`, which bindgen emits for stdint.h's types (kfuse's "
                                "declarations use Rust's fixed-width integers)" % alias.group(1)))
        elif opaque and opaque.group(1) in docs and lines[i - 2] == "#[repr(C)]":
            out.insert(len(out) - 2, doc_attr(docs[opaque.group(1)]))
        out.append(line)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out))


if __name__ == "__main__":
    main()
