"""Hypothesis profiles for the property tests: "quick" in the default run, "thorough"
(10,000 examples a property) for the slow tier, `HYPOTHESIS_PROFILE=thorough` (.ci/run)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

THOROUGH_EXAMPLES = 10_000

# database=None: no example database written into the repository (.hypothesis/), and runs
# that do not depend on what an earlier run found. derandomize: the examples follow from the
# code alone, so a CI run fails only on what a change did, and a failure replays as it came.
# `HYPOTHESIS_PROFILE=explore` draws new random examples, for a search of one's own.
settings.register_profile(
    "quick",
    max_examples=100,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=THOROUGH_EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.register_profile(
    "explore",
    max_examples=THOROUGH_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "quick"))
