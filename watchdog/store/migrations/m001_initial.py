"""The first schema: fingerprints, probe results, GPU samples and events, per-minute rollups.

Columns are spelled out here rather than derived from `llm_watchdog.models`: a released migration
must build the same tables forever, whatever the dataclasses grow into. A field added to a
dataclass needs a new migration that adds its column (tests/store/test_store.py checks that every
field has one).

Booleans are INTEGER 0/1 (NULL where the model allows None). Times are REAL unix seconds;
rollup buckets start on a whole minute or hour (`ts` is an INTEGER).

The raw tables use AUTOINCREMENT: rollup remembers the last row id it has seen, and without
AUTOINCREMENT SQLite reuses ids once the newest rows are deleted
(https://www.sqlite.org/autoinc.html), so rows written after a full prune would be skipped.
"""

from __future__ import annotations

import sqlite_utils

STATEMENTS = [
    """
    CREATE TABLE fingerprints (
        id TEXT PRIMARY KEY,  -- Fingerprint.id: a hash of the key fields
        engine TEXT NOT NULL,
        engine_version TEXT NOT NULL,
        model TEXT NOT NULL,
        launch_command TEXT NOT NULL,
        driver_version TEXT NOT NULL,
        gpu_name TEXT NOT NULL,
        gpu_uuid TEXT NOT NULL,
        probe_set_hash TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        extra TEXT NOT NULL DEFAULT '{}',  -- JSON object
        first_seen REAL NOT NULL,
        last_seen REAL NOT NULL
    )
    """,
    """
    CREATE TABLE probes (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        fingerprint_id TEXT REFERENCES fingerprints(id),
        prompt_id TEXT NOT NULL,
        probe_set TEXT NOT NULL,
        url TEXT NOT NULL,
        model TEXT NOT NULL,
        ok INTEGER NOT NULL,
        cache_mode TEXT NOT NULL,
        cache_bust TEXT NOT NULL,
        connection TEXT NOT NULL,
        error_class TEXT,
        error_detail TEXT,
        http_status INTEGER,
        ttft_ms REAL,
        first_event_ms REAL,
        total_ms REAL,
        output_tokens INTEGER,
        gap_p50_ms REAL,
        gap_max_ms REAL,
        answer TEXT NOT NULL,
        quality_pass INTEGER,
        load_duration_ms REAL,
        cold INTEGER NOT NULL
    )
    """,
    "CREATE INDEX idx_probes_ts ON probes (ts)",
    """
    CREATE TABLE gpu_samples (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        gpu_index INTEGER NOT NULL,
        uuid TEXT,
        temp_c REAL,
        sm_clock_mhz REAL,
        sm_clock_max_mhz REAL,
        mem_clock_mhz REAL,
        mem_clock_max_mhz REAL,
        power_w REAL,
        power_limit_w REAL,
        util_gpu_pct REAL,
        util_mem_pct REAL,
        fan_pct REAL,
        pstate INTEGER,
        throttle_reasons INTEGER,
        thermal_violation_ms REAL,
        power_violation_ms REAL,
        temp_slowdown_c REAL
    )
    """,
    "CREATE INDEX idx_gpu_samples_ts ON gpu_samples (ts)",
    # "Latest sample of each GPU" and per-GPU ranges read this one.
    "CREATE INDEX idx_gpu_samples_gpu_index_ts ON gpu_samples (gpu_index, ts)",
    """
    CREATE TABLE gpu_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        kind TEXT NOT NULL,
        gpu_index INTEGER,
        detail TEXT NOT NULL DEFAULT ''
    )
    """,
    "CREATE INDEX idx_gpu_events_ts ON gpu_events (ts)",
    # Rollups: one row per minute (probes_1m, gpu_1m) and per hour (probes_1h, gpu_1h), each
    # computed from raw rows when its minute or hour is over, so hourly percentiles are exact.
    # TTFT figures are over warm, successful probes only: cold starts are kept apart (cold_n,
    # cold_ttft_max_ms) so they never pull a baseline. fingerprint_id is '' for probes recorded
    # without one, since a primary key column holding NULL would never conflict.
    # WITHOUT ROWID: the rows live in the primary-key b-tree, with no second index beside them
    # (https://www.sqlite.org/withoutrowid.html); a third less space per row here.
    *(
        f"""
    CREATE TABLE {name} (
        ts INTEGER NOT NULL,  -- start of the minute or hour
        fingerprint_id TEXT NOT NULL,
        n INTEGER NOT NULL,
        ok_n INTEGER NOT NULL,
        cold_n INTEGER NOT NULL,
        quality_n INTEGER NOT NULL,  -- probes whose answer was judged
        quality_fail_n INTEGER NOT NULL,
        ttft_n INTEGER NOT NULL,
        ttft_mean_ms REAL,
        ttft_p50_ms REAL,
        ttft_p95_ms REAL,
        ttft_min_ms REAL,
        ttft_max_ms REAL,
        cold_ttft_max_ms REAL,
        total_n INTEGER NOT NULL,
        total_mean_ms REAL,
        errors TEXT NOT NULL DEFAULT '{{}}',  -- JSON object: error class -> count
        PRIMARY KEY (ts, fingerprint_id)
    ) WITHOUT ROWID
    """
        for name in ("probes_1m", "probes_1h")
    ),
    *(
        f"""
    CREATE TABLE {name} (
        ts INTEGER NOT NULL,  -- start of the minute or hour
        gpu_index INTEGER NOT NULL,
        uuid TEXT,
        n INTEGER NOT NULL,
        temp_mean_c REAL,
        temp_max_c REAL,
        sm_clock_mean_mhz REAL,
        sm_clock_min_mhz REAL,
        sm_clock_max_mhz REAL,  -- the clock's ceiling, not the highest clock seen
        mem_clock_mean_mhz REAL,
        mem_clock_max_mhz REAL,
        power_mean_w REAL,
        power_max_w REAL,
        power_limit_w REAL,  -- lowest enforced limit in the bucket
        util_gpu_mean_pct REAL,
        util_mem_mean_pct REAL,
        fan_mean_pct REAL,
        pstate_max INTEGER,  -- highest P-state number: the slowest state seen
        throttle_reasons INTEGER,  -- OR of every sample's reasons
        thermal_n INTEGER,  -- samples with a thermal reason bit (llm_watchdog.nvml.throttle)
        power_n INTEGER,  -- samples with a power reason bit
        thermal_violation_ms REAL,  -- sums over the bucket
        power_violation_ms REAL,
        temp_slowdown_c REAL,
        PRIMARY KEY (ts, gpu_index)
    ) WITHOUT ROWID
    """
        for name in ("gpu_1m", "gpu_1h")
    ),
    # How far each rollup table has got (see Store.rollup).
    """
    CREATE TABLE _rollup_state (
        name TEXT PRIMARY KEY,  -- the rollup table
        last_id INTEGER NOT NULL,  -- raw rows up to this id are in it
        rolled_until REAL NOT NULL,  -- every bucket before this has been rolled up
        deleted_before REAL NOT NULL  -- raw rows before this are gone
    )
    """,
    "INSERT INTO _rollup_state VALUES "
    "('probes_1m', 0, 0, 0), ('probes_1h', 0, 0, 0), ('gpu_1m', 0, 0, 0), ('gpu_1h', 0, 0, 0)",
]


def up(db: sqlite_utils.Database) -> None:
    for sql in STATEMENTS:
        db.execute(sql)
