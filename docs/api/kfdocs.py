"""Sphinx extension of kfuse's API reference: the `kf-calls` directive, which lists the C
declarations of kfuse.h whose names start with the given prefixes (functions, then structs),
each as a cross-reference into the C reference with its one-line summary, read from Doxygen's
XML. An op page names its prefixes once and the list follows the header as it grows.

    ```{kf-calls} kf_rnn_
    ```
"""
import xml.etree.ElementTree as ET
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx import addnodes


def _brief(elem):
    return " ".join("".join(elem.find("briefdescription").itertext()).split())


def _item(reftype, name, brief):
    """A list item: the name as a cross-reference into the C domain, then its summary. Built as
    nodes, so that it reads the same from a Markdown page and from a reStructuredText one."""
    ref = addnodes.pending_xref("", refdomain="c", reftype=reftype, reftarget=name,
                                refexplicit=False)
    ref += nodes.literal(name, name + ("()" if reftype == "func" else ""))
    return nodes.list_item("", nodes.paragraph("", "", ref, nodes.Text(": " + brief)))


class KfCalls(Directive):
    required_arguments = 1
    optional_arguments = 8

    def run(self):
        env = self.state.document.settings.env
        xml_dir = Path(env.config.breathe_projects[env.config.breathe_default_project])
        prefixes = tuple(self.arguments)
        header = ET.parse(xml_dir / "kfuse_8h.xml").getroot()
        items = []
        for m in header.iter("memberdef"):
            if m.get("kind") == "function" and m.findtext("name").startswith(prefixes):
                items.append(_item("func", m.findtext("name"), _brief(m)))
        for ref in header.iter("innerclass"):
            if ref.text.startswith(prefixes):
                struct = ET.parse(xml_dir / (ref.get("refid") + ".xml")).getroot()
                items.append(_item("struct", ref.text, _brief(struct.find("compounddef"))))
        if not items:
            raise self.error("kf-calls: no declaration of kfuse.h starts with %s"
                             % " or ".join(prefixes))
        return [nodes.bullet_list("", *items, bullet="-")]


def setup(app):
    app.add_directive("kf-calls", KfCalls)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
