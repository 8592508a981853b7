"""The NVML edge: GPU telemetry (reader) and clock-event reason bits (throttle). The only package
that imports pynvml.
"""
