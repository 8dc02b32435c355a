"""The refusals of the live planner; the API maps each to its HTTP status (`api/app.py`)."""

from __future__ import annotations


class NotFound(LookupError):
    """404: no such program, lease or op."""


class Forbidden(PermissionError):
    """403: another tenant's program or lease, another node's op."""


class Conflict(RuntimeError):
    """409: a stale version or epoch, a cancelled lease or program, an op already closed."""


class Invalid(ValueError):
    """422: a well-formed request that names what does not exist (an unknown model)."""


class Unavailable(RuntimeError):
    """503: the ledger refused the write (disk full, I/O error); nothing of the request was kept."""


REFUSAL_STATUS = {NotFound: 404, Forbidden: 403, Conflict: 409, Invalid: 422}
"""The HTTP status of each refusal (`api/app.py` maps the exceptions with it)."""
