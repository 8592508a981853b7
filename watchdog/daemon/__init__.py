"""The long-running service: scheduler wiring, the judging and steering loops, the HTTP read side,
the systemd install.
"""
