"""Reading a Prometheus exposition in tests: parsed with prometheus-client's own parser, so a
test asserts samples and labels, not the text's order or spacing."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families


def families(text: str) -> dict[str, Any]:
    """Metric families by name (a counter's family name has no `_total`)."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams: dict[str, Any], family: str, name: str, **labels: str) -> float:
    """The value of the first sample `name` of `family` whose labels include `labels`."""
    for s in fams[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return float(s.value)
    raise AssertionError(f"no sample {name} with {labels} in {family}")
