"""The one error type for bad input: it names the file, the place in it and what is wrong."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. The CLI prints `str(err)` and exits 2, without a traceback."""

    def __init__(self, source: str, where: str, what: str):
        self.source, self.where, self.what = source, where, what
        loc = f"{source}:{where}" if where else source
        super().__init__(f"{loc}: {what}")

    def __reduce__(self):
        # Rebuilt from its three parts: a sweep's worker process raises it to the parent intact
        # (the default rebuilds from the message alone, and the parent saw BrokenProcessPool).
        return type(self), (self.source, self.where, self.what)


def pydantic_where(err) -> tuple[str, str]:
    """(field path, message) of the first error of a pydantic ValidationError."""
    first = err.errors()[0]
    path = ".".join(str(p) for p in first.get("loc", ()))
    return path, first.get("msg", str(err))
