"""The allowance law and its inputs: pure, time-injected; the comparison controllers beside it."""
