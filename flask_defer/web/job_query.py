"""The dashboard's list filters, read from the query string and refused when malformed.

Every value comes from the URL, so each is checked here and a bad one answers 400
(never a 500 from deep in the store): an unknown status, an over-long name, a page
that is not a positive integer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flask import abort
from werkzeug.datastructures import MultiDict

from ..i18n import gettext
from ..jobs import JobStatus

#: The highest page number accepted; beyond it the offset would be absurd.
MAX_PAGE = 1_000_000
#: Longest accepted text filter (the columns hold 255 characters).
MAX_TEXT = 255
#: The text filters, by query parameter.
TEXT_FILTERS = ("name", "key_prefix", "owner")


@dataclass(frozen=True, slots=True)
class JobQuery:
    """One view of the job list: filters and a page number."""

    status: JobStatus | None = None
    name: str | None = None
    key_prefix: str | None = None
    owner: str | None = None
    page: int = 1

    @classmethod
    def from_args(cls, args: MultiDict[str, str]) -> JobQuery:
        """Parse the query string (or a bulk action's form); abort 400 on a bad value."""
        statuses = [value for value in args.getlist("status") if value]
        if len(statuses) > 1:
            abort(400, description=gettext("Give one status to filter by."))
        status = None
        if statuses:
            try:
                status = JobStatus(statuses[0])
            except ValueError:
                allowed = ", ".join(s.value for s in JobStatus)
                abort(
                    400,
                    description=gettext(
                        "Unknown status; expected one of {allowed}.", allowed=allowed
                    ),
                )
        texts: dict[str, str | None] = {}
        for field in TEXT_FILTERS:
            values = args.getlist(field)
            if len(values) > 1:
                abort(400, description=gettext("Give one {field} to filter by.", field=field))
            value = values[0].strip() if values else ""
            if len(value) > MAX_TEXT or any(ord(char) < 32 for char in value):
                abort(
                    400,
                    description=gettext("The {field} filter is not a valid value.", field=field),
                )
            texts[field] = value or None
        return cls(status=status, page=_page(args.get("page")), **texts)

    @property
    def filters(self) -> dict[str, Any]:
        """The keyword arguments of ``defer.list`` / ``count`` / the bulk actions."""
        return {
            "status": self.status,
            "name": self.name,
            "key_prefix": self.key_prefix,
            "owner": self.owner,
        }

    @property
    def narrowed(self) -> bool:
        """True when a name, key prefix or owner narrows the list (bulk cancel needs it)."""
        return any(value is not None for value in (self.name, self.key_prefix, self.owner))

    @property
    def is_filtered(self) -> bool:
        """True when any filter is set."""
        return self.status is not None or self.narrowed

    def args(self, **changes: Any) -> dict[str, Any]:
        """Query-string arguments for ``url_for`` (unset filters and page 1 left out)."""
        query = replace(self, **changes)
        values: dict[str, Any] = {
            "status": query.status.value if query.status is not None else None,
            "name": query.name,
            "key_prefix": query.key_prefix,
            "owner": query.owner,
            "page": query.page if query.page != 1 else None,
        }
        return {name: value for name, value in values.items() if value is not None}


def _page(value: str | None) -> int:
    if value is None or value == "":
        return 1
    if not value.isdigit() or not value.isascii():
        abort(400, description=gettext("The page must be a positive integer."))
    page = int(value) if len(value) <= 10 else MAX_PAGE + 1
    if not 1 <= page <= MAX_PAGE:
        abort(400, description=gettext("The page must be from 1 to {max}.", max=MAX_PAGE))
    return page
