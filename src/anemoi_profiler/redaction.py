"""Keep secrets out of artifacts, params and reports: credentials in URIs and secret-looking values."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "***"
_SECRET_NAME = re.compile(r"(pass(word|wd)?|secret|token|api[_-]?key|access[_-]?key|credential|auth)", re.I)
_URI_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def redact_uri(uri: str) -> str:
    """Drop `user:password@` and secret query parameters from a URI; other strings pass through."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return uri
    if not parts.scheme or not parts.netloc:
        return uri
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rsplit('@', 1)[1]}"
    query = urlencode(
        [(k, REDACTED if is_secret_name(k) else v) for k, v in parse_qsl(parts.query, keep_blank_values=True)],
        safe="*",
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_text(text: str) -> str:
    """Redact every URI inside free text, such as an error message that quotes the URL it failed on."""
    return _URI_IN_TEXT.sub(lambda match: redact_uri(match.group(0)), text)


def redact(value: Any, name: str = "") -> Any:
    """Redact a value for publication: secret-named keys are hidden, URIs lose their credentials."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, name) for v in value]
    if name and is_secret_name(name) and value not in (None, ""):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
    return value
