"""Any program as an actuator: the allowance in its environment, a JSON read-back."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence

from llm_watchdog.actuators.base import (
    ENV_ALLOWANCE,
    ENV_LEASE_S,
    ENV_REASON,
    ActuatorError,
    ApplyResult,
    ReadBack,
    Verification,
    verify_with,
)


class CommandActuator:
    """Run `argv` with the allowance in its environment (LLM_WATCHDOG_ALLOWANCE, _LEASE_S,
    _REASON). Exit 0 is success. Optional `read_argv` prints JSON with at least `allowance`
    (and `inflight`, `queued` if it knows them) for the read-back.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        read_argv: Sequence[str] | None = None,
        timeout_s: float = 10.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("CommandActuator needs a program to run (argv is empty)")
        self.argv = list(argv)
        self.read_argv = list(read_argv) if read_argv else None
        self.timeout_s = timeout_s
        self.env = dict(os.environ if env is None else env)
        self.name = f"command {self.argv[0]}"

    def _run(self, argv: list[str], extra: Mapping[str, str]) -> str:
        try:
            proc = subprocess.run(
                argv,
                env={**self.env, **extra},
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise ActuatorError(f"cannot run {argv[0]}: no such program (check the path)") from None
        except PermissionError:
            raise ActuatorError(f"cannot run {argv[0]}: permission denied (chmod +x?)") from None
        except subprocess.TimeoutExpired:
            raise ActuatorError(
                f"{argv[0]} did not finish within {self.timeout_s:g} s and was stopped"
            ) from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise ActuatorError(f"{argv[0]} exited with status {proc.returncode}: {last[:200]}")
        return proc.stdout

    def apply(self, allowance: int, lease_s: float, reason: str) -> ApplyResult:
        env = {ENV_ALLOWANCE: str(allowance), ENV_LEASE_S: f"{lease_s:g}", ENV_REASON: reason}
        try:
            self._run(self.argv, env)
        except ActuatorError as exc:
            return ApplyResult(False, allowance, str(exc))
        return ApplyResult(True, allowance, f"{self.name}: allowance {allowance}", lease_s)

    def read_back(self) -> ReadBack:
        if not self.read_argv:
            raise ActuatorError(f"{self.name} has no read-back command configured")
        out = self._run(self.read_argv, {})
        try:
            data = json.loads(out)
            return ReadBack(data["allowance"], data.get("inflight"), data.get("queued"))
        except (ValueError, KeyError, TypeError):
            raise ActuatorError(
                f'{self.read_argv[0]} must print JSON like {{"allowance": 4, "inflight": 2}}'
                f", got {out.strip()[:80]!r}"
            ) from None

    def verify(self, expected: int, *, check_inflight: bool = True) -> Verification:
        if not self.read_argv:
            return Verification(True, "unverified", f"{self.name}: no read-back configured")
        return verify_with(self, expected, check_inflight)

    def close(self) -> None:
        """Nothing is held open."""
