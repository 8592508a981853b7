"""Reports: one self-contained page (or picture) of what a span of time looked like.

`data` turns the daemon's rows or a Prometheus server's series into a `Report`, `charts`
draws it with matplotlib (Agg) and `page` lays it out as HTML; `prometheus` reads the series.
"""

from llm_watchdog.report.charts import report_png
from llm_watchdog.report.data import Report, from_rows
from llm_watchdog.report.page import report_html

__all__ = ["Report", "from_rows", "report_html", "report_png"]
