"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``).

The docstrings use Sphinx's inline roles (``:class:`~iris_fw.x.Y```, ``:func:`init```), which
the API reference would show literally (":class:~iris_fw.x.Y"). This hook renders them as code:
the role is dropped and a leading ``~`` keeps only the last dotted name, as Sphinx does.
"""

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(<code>)~?([\w.]*?)([\w]+)(</code>)")


def _render(match: re.Match) -> str:
    tilde = match.group(0)[match.group(0).index("<code>") + 6:].startswith("~")
    name = match.group(3) if tilde else match.group(2) + match.group(3)
    return f"{match.group(1)}{name}{match.group(4)}"


def on_page_content(html, **kwargs):
    return _ROLE.sub(_render, html)
