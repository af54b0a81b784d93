"""Label syntax, as Kubernetes has it (apimachinery's ``IsQualifiedName`` and
``IsValidLabelValue``): the one home of what a label key and a label value may be.

Asked by the manifest reader (``godel/manifest.py``: the client's error names the manifest's
field), the dispatcher's validation of what is submitted and applied (a forged request is
refused too), the selector parser (``labelselector.parse``) and the node agent's own labels.
A selector value no label can hold would make an ``In`` term match nothing and a ``NotIn`` term
match everything, silently: selectors are held to the same syntax as labels.

- a key is ``[prefix/]name``: the optional prefix a DNS-1123 subdomain of at most 253
  characters, the name at most 63 alphanumerics, ``-``, ``_`` and ``.``, starting and ending
  with an alphanumeric;
- a value is empty, or such a name.

Each function returns None when the text is valid, else the problem in words (quoting the text),
for the caller to put after the field it came from.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 63
MAX_PREFIX_LENGTH = 253
# Matched whole (fullmatch): a '$' would let a trailing newline through.
_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_NAME_RULE = "alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric"


def key_problem(key: str) -> str | None:
    """What is wrong with a label key, or None."""
    if not key:
        return "a label key must not be empty"
    prefix, slash, name = key.rpartition("/")
    if slash:
        if not prefix:
            return f"{key!r}: the prefix before '/' must not be empty"
        if len(prefix) > MAX_PREFIX_LENGTH:
            return (
                f"{key!r}: the prefix must be at most {MAX_PREFIX_LENGTH} characters "
                f"(got {len(prefix)})"
            )
        if not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
            return (
                f"{key!r}: prefix {prefix!r} is not a DNS-1123 subdomain (lowercase letters, "
                "digits, '-' and '.', starting and ending with a letter or digit)"
            )
    if len(name) > MAX_NAME_LENGTH:
        return f"{key!r}: the name must be at most {MAX_NAME_LENGTH} characters (got {len(name)})"
    if not _NAME_RE.fullmatch(name):
        return (
            f"{key!r} is not a valid label key (a name of at most {MAX_NAME_LENGTH} "
            f"{_NAME_RULE}, with an optional DNS-1123 subdomain prefix and '/')"
        )
    return None


def value_problem(value: str) -> str | None:
    """What is wrong with a label value, or None (empty is a value)."""
    if len(value) > MAX_NAME_LENGTH:
        return f"a label value must be at most {MAX_NAME_LENGTH} characters (got {len(value)})"
    if value and not _NAME_RE.fullmatch(value):
        return f"{value!r} is not a valid label value (empty, or {_NAME_RULE})"
    return None
