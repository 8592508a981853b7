"""Reports: one self-contained page (or picture) of what a span of time looked like.

`data` turns the daemon's rows or a Prometheus server's series into a `Report`, `charts`
draws it with matplotlib (Agg) and `page` lays it out as HTML; `prometheus` reads the series.
Nothing is imported here: matplotlib costs a second and writes its config folder on first
import, and every `llm-watchdog` command (the gateway's and the daemon's units too) loads
the CLI that names this package.
"""
