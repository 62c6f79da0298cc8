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
from docutils.statemachine import StringList
from sphinx.util.nodes import nested_parse_with_titles


def _brief(elem):
    return " ".join("".join(elem.find("briefdescription").itertext()).split())


class KfCalls(Directive):
    required_arguments = 1
    optional_arguments = 8

    def run(self):
        env = self.state.document.settings.env
        xml_dir = Path(env.config.breathe_projects[env.config.breathe_default_project])
        prefixes = tuple(self.arguments)
        header = ET.parse(xml_dir / "kfuse_8h.xml").getroot()
        lines = []
        for m in header.iter("memberdef"):
            if m.get("kind") == "function" and m.findtext("name").startswith(prefixes):
                lines.append("- :c:func:`%s`: %s" % (m.findtext("name"), _brief(m)))
        for ref in header.iter("innerclass"):
            if ref.text.startswith(prefixes):
                struct = ET.parse(xml_dir / (ref.get("refid") + ".xml")).getroot()
                lines.append("- :c:struct:`%s`: %s"
                             % (ref.text, _brief(struct.find("compounddef"))))
        if not lines:
            raise self.error("kf-calls: no declaration of kfuse.h starts with %s"
                             % " or ".join(prefixes))
        container = nodes.container()
        nested_parse_with_titles(self.state, StringList(lines, source="kfuse.h"), container)
        return container.children


def setup(app):
    app.add_directive("kf-calls", KfCalls)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
