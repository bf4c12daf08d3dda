"""Exports: a finished run directory into the files trainers read.

Its own room, beside the runs that write records (``batch``, ``env eval``, ``rl``) and above the
record and trajectory layers it reads: :mod:`.formats` (every format, the selection of samples, the
statistics sidecars; docs/formats.md has each trainer's config) and :mod:`.parquet` (the one typed
table). ``trajforge export`` is its command.
"""

from trajforge.export.formats import (
    FORMATS,
    EmptyExportError,
    ExportError,
    ExportOptions,
    export,
    export_run,
)

__all__ = ["FORMATS", "EmptyExportError", "ExportError", "ExportOptions", "export", "export_run"]
