"""Storage: every SQL statement of the project, over one SQLite file (Store in db, the rows,
rollups, drift and control records, migrations).
"""
