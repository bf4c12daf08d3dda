"""``trajforge report``: one static HTML file that shows what a run made.

Reads only the files a run directory holds (the merged JSONL outputs, ``statistics.json``,
``run.json``), so it knows the line schema as data and imports nothing above the ground floor.
The page works offline from disk: charts are SVG drawn here, the trajectory browser is one
inline script under a Content-Security-Policy that allows only that script, and every piece of
model output reaches the page as escaped text or as JSON read with ``textContent``.
"""

from __future__ import annotations

from trajforge.report.build import ReportSummary, build_report
from trajforge.report.options import ReportOptions
from trajforge.report.source import ReportError

__all__ = ["ReportError", "ReportOptions", "ReportSummary", "build_report"]
