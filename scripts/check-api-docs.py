#!/usr/bin/env python3
"""Holds the API reference (scripts/build-docs.sh) to what it must cover, from sources that do not
depend on the documentation tools:

  C       every KF_API function, enum and enum value, struct and struct field, typedef and KF_*
          macro that capi/include/kfuse.h declares (read by the C compiler's preprocessor and
          pycparser, as the Python binding reads it) has a non-empty description in Doxygen's XML;
  Python  every module of the kfuse package (bindings/python/kfuse, every file of kfuse/torch
          included) is a module of the Sphinx build, and every public name each one exports
          (its __all__, else its public classes and functions) is documented there (objects.inv);
  Rust    every link from the Sphinx pages into the rustdoc output points at a file that exists.

Usage: check-api-docs.py DOCS_OUT   (the folder build-docs.sh wrote: doxygen/xml, html, rust)
Prints what is missing and exits 1, or prints a one-line summary.
"""
import ast
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from pycparser import c_ast, c_parser

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "capi/include/kfuse.h"
PYPKG = ROOT / "bindings/python/kfuse"
# the export macro: how a declaration is exported, not part of the documented API
NOT_API = {"KF_API"}


# ---- C: what kfuse.h declares -------------------------------------------------------------------

def header_declarations():
    """(kind, name) for everything kfuse.h declares, kinds: function, enum, enumvalue, struct,
    field (name "struct.field"), typedef, define."""
    with tempfile.TemporaryDirectory() as stub:
        for name in ("stddef.h", "stdint.h"):
            Path(stub, name).write_text("")
        pre = subprocess.run(["cc", "-E", "-dD", "-undef", "-nostdinc", "-I", stub, "-x", "c",
                              str(HEADER)], check=True, stdout=subprocess.PIPE,
                             universal_newlines=True).stdout
    decls = set()
    code = ["typedef unsigned long size_t;"] + [
        "typedef %s %sint%d_t;" % (t, u, b) for b, t in ((8, "char"), (16, "short"), (32, "int"),
                                                          (64, "long")) for u in ("", "u")]
    in_header = False
    for line in pre.splitlines():
        marker = re.match(r'#\s*\d+\s+"(.*)"', line)
        if marker:
            in_header = Path(marker.group(1)).resolve() == HEADER.resolve()
            continue
        if not in_header:
            continue
        define = re.match(r"#\s*define\s+(KF_\w+)", line)
        if define and define.group(1) not in NOT_API:
            decls.add(("define", define.group(1)))
        elif not line.startswith("#"):
            code.append(line.replace("signed char", "char"))
    ast_ = c_parser.CParser().parse("\n".join(code), filename=str(HEADER))

    def visit_type(node):
        if isinstance(node, c_ast.Enum) and node.values is not None:
            decls.add(("enum", node.name))
            for v in node.values.enumerators:
                decls.add(("enumvalue", v.name))
        elif isinstance(node, c_ast.Struct) and node.decls is not None:
            decls.add(("struct", node.name))
            for f in node.decls:
                decls.add(("field", "%s.%s" % (node.name, f.name)))

    for ext in ast_.ext:
        if isinstance(ext, c_ast.Typedef):
            if ext.name.startswith("kf_"):
                decls.add(("typedef", ext.name))
                visit_type(ext.type.type)
        elif isinstance(ext, c_ast.Decl):
            if isinstance(ext.type, c_ast.FuncDecl):
                decls.add(("function", ext.name))
            else:
                visit_type(ext.type)
    return decls


# ---- C: what Doxygen documented -----------------------------------------------------------------

def described(elem):
    text = "".join(elem.find("briefdescription").itertext()) + "".join(
        elem.find("detaileddescription").itertext())
    return bool(text.strip())


def doxygen_documented(xml_dir):
    """(kind, name) for every declaration with a description in Doxygen's XML."""
    done = set()
    for path in Path(xml_dir).glob("*.xml"):
        root = ET.parse(path).getroot()
        for compound in root.iter("compounddef"):
            cname = compound.findtext("compoundname")
            if compound.get("kind") == "struct" and described(compound):
                done.add(("struct", cname))
                done.add(("typedef", cname))  # TYPEDEF_HIDES_STRUCT: one entry, one text
            for m in compound.iter("memberdef"):
                name, kind = m.findtext("name"), m.get("kind")
                if kind == "variable" and compound.get("kind") == "struct" and described(m):
                    done.add(("field", "%s.%s" % (cname, name)))
                elif kind in ("function", "define", "enum", "typedef") and described(m):
                    done.add((kind, name))
                    if kind == "enum":  # TYPEDEF_HIDES_STRUCT: typedef enum kf_x {..} kf_x;
                        done.add(("typedef", name))
                if kind == "enum":
                    for v in m.iter("enumvalue"):
                        if described(v):
                            done.add(("enumvalue", v.findtext("name")))
    return done


def check_c(out):
    declared = header_declarations()
    documented = doxygen_documented(out / "doxygen/xml")
    missing = sorted(d for d in declared if d not in documented)
    if not any(k == "function" for k, _ in declared):
        missing.append(("function", "(none found in kfuse.h: the check is broken)"))
    return ["C: %s %s has no description in the Doxygen output" % d for d in missing], declared


# ---- Python ------------------------------------------------------------------------------------

def package_modules():
    """name -> public names, for every module of the kfuse package."""
    mods = {}
    for path in sorted(PYPKG.rglob("*.py")):
        parts = path.relative_to(PYPKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text())
        public = None
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
                public = [ast.literal_eval(e) for e in node.value.elts]
        if public is None:
            public = [n.name for n in tree.body if isinstance(
                n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
        mods[name] = public
    return mods


def check_python(out):
    from sphinx.util.inventory import InventoryFile
    with open(out / "html/objects.inv", "rb") as f:
        inv = InventoryFile.load(f, "", lambda base, uri: uri)
    modules = set(inv.get("py:module", {}))
    objects = set()
    for kind, entries in inv.items():
        if kind.startswith("py:"):
            objects.update(entries)
    problems = []
    mods = package_modules()
    for mod, public in mods.items():
        if mod not in modules:
            problems.append("Python: module %s is not in the Sphinx build" % mod)
            continue
        for name in public:
            # a name re-exported from another module is documented where it is defined
            if "%s.%s" % (mod, name) not in objects and not any(
                    o.endswith("." + name) for o in objects):
                problems.append("Python: %s.%s is not documented" % (mod, name))
    return problems, mods


# ---- Rust links --------------------------------------------------------------------------------

def check_rust_links(out):
    problems, links = [], 0
    for page in (out / "html").glob("*.html"):
        for href in re.findall(r'href="(\.\./rust/[^"#]+)', page.read_text()):
            links += 1
            if not (out / "html" / href).resolve().exists():
                problems.append("Rust: %s links to %s, which rustdoc did not write"
                                % (page.name, href))
    if not links:
        problems.append("Rust: no page links into the rustdoc output (build/docs/rust)")
    return problems, links


def main():
    out = Path(sys.argv[1]).resolve()
    c_problems, declared = check_c(out)
    py_problems, mods = check_python(out)
    rust_problems, links = check_rust_links(out)
    problems = c_problems + py_problems + rust_problems
    for p in problems:
        print(p)
    if problems:
        print("check-api-docs: %d missing" % len(problems))
        return 1
    print("check-api-docs: %d C declarations of kfuse.h, %d Python modules (%d public names), "
          "%d links into rustdoc: all documented"
          % (len(declared), len(mods), sum(map(len, mods.values())), links))
    return 0


if __name__ == "__main__":
    sys.exit(main())
