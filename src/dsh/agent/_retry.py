"""Retries of a model request whose stream broke: the `llm/retry` and `llm/retry-started` events.

Layer: agent (private to `dsh.agent.loop`). A step whose stream failed with a `ModelError` marked
`retryable` is requested again, inside the same step, under the model client's `RetryPolicy`
(docs/agent.md#retries). The bookkeeping follows the TypeScript harness's `llm-retry` plugin, so a
log with retries stays readable by it: before the wait an `llm/retry` event records the retry
(`retryId` shared by the step's chain, `retry` counting from 1, the policy, the delay and the
failure), and after the wait `llm/retry-started` records that the next attempt begins. A wait
cut short by a cancellation writes no `llm/retry-started`. Nothing here is model-visible: the
failed attempt left no `assistant/message`, so the retried request is rebuilt from the same surface.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dsh.abort import AbortSignal
from dsh.agent.errors import ModelError
from dsh.agent.model import RetryPolicy
from dsh.session.session import Session

__all__ = ["StepRetries"]

_log = logging.getLogger("dsh.agent")

_A = TypeVar("_A")


class StepRetries:
    """The retry chain of one step: decides, records and waits."""

    def __init__(self, session: Session, *, provider: str, policy: RetryPolicy | None, turn: int, step: int) -> None:
        self._session = session
        self._provider = provider
        self._policy = policy
        self._turn = turn
        self._step = step
        self._retry = 0
        self._retry_id = f"retry-{uuid.uuid4()}"

    @property
    def used(self) -> int:
        """How many retries this step has scheduled."""
        return self._retry

    def schedule(self, failure: ModelError) -> float | None:
        """Record the next retry of `failure` and return its delay in ms; None when it is not retried.

        Not retried: a failure that is not `retryable`, a client without a policy, a spent budget, or
        a provider `Retry-After` longer than the policy's longest delay.
        """
        policy = self._policy
        if policy is None or not failure.retryable or self._retry >= policy.max_retries:
            return None
        retry = self._retry + 1
        hint = failure.retry_after_ms
        if hint is not None and hint > 0:
            if hint > policy.max_delay_ms:
                return None
            delay = float(hint)
        else:
            delay = policy.delay_ms(retry, random.random())  # noqa: S311 - jitter, not cryptography
        self._retry = retry
        data: dict[str, Any] = {
            "retryId": self._retry_id,
            "turn": self._turn,
            "step": self._step,
            "provider": self._provider,
            "mode": "normal",
            "policyKey": policy.key,
            "retry": retry,
            "maxRetries": policy.max_retries,
            "delayMs": round(delay),
            "failure": failure.to_json(),
        }
        self._session.append("llm/retry", data)
        return delay

    async def wait(self, delay_ms: float, signal: AbortSignal) -> bool:
        """Wait out the delay unless `signal` aborts first; True (and `llm/retry-started`) when it ran out."""
        if signal.aborted:
            return False
        aborted = asyncio.ensure_future(signal.wait())
        try:
            done, _ = await asyncio.wait((aborted,), timeout=delay_ms / 1000)
        finally:
            aborted.cancel()
        if done or signal.aborted:
            return False
        self._session.append(
            "llm/retry-started",
            {"retryId": self._retry_id, "turn": self._turn, "step": self._step, "retry": self._retry},
        )
        return True

    async def run(
        self,
        attempt: Callable[[], Awaitable[tuple[_A, list[int], ModelError | None]]],
        *,
        signal: AbortSignal,
        flush: Callable[[], Awaitable[None]],
        label: str,
    ) -> tuple[_A | None, list[int], ModelError | None]:
        """Run `attempt` (one streamed request) until it succeeds, is cancelled, or is not retried.

        A failed attempt leaves its logged chunks in the log but no `assistant/message`, so the next
        attempt is built from the same surface and the model never sees the partial step. The
        `llm/retry` event is flushed before the wait, as the harness makes it durable first. A wait
        cut short by `signal` returns no result and no failure: the caller sees the abort, and the failed
        attempt's partial answer is dropped.
        """
        while True:
            result, chunk_seqs, failure = await attempt()
            if failure is None or signal.aborted:
                return result, chunk_seqs, failure
            delay_ms = self.schedule(failure)
            if delay_ms is None:
                return result, chunk_seqs, failure
            _log.warning(
                'agent "%s": model stream failed (%s), retry %d in %.0f ms', label, failure.code, self._retry, delay_ms
            )
            await flush()
            if not await self.wait(delay_ms, signal):
                return None, [], None
