"""Migration 6: the GPU's target temperature beside each sample, and learned thresholds.

`gpu_samples.temp_target_c` keeps NVML's ACOUSTIC_CURR threshold (the "GPU Target
Temperature"), so `history --export-trace` writes the replay trace's `temp_target_c` column.
`learned_thresholds` keeps, per card UUID, the temperature it was first seen to raise
SwThermalSlowdown at: the heat warning's threshold on a card that reports none.
"""

from __future__ import annotations

import sqlite_utils


def up(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE gpu_samples ADD COLUMN temp_target_c REAL")
    db.execute(
        """
        CREATE TABLE learned_thresholds (
            gpu_uuid TEXT PRIMARY KEY,
            temp_c REAL NOT NULL,  -- first temperature seen with SwThermalSlowdown
            ts REAL NOT NULL,      -- when
            gpu_index INTEGER
        )
        """
    )
