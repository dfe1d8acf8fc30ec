"""The demo: an embedded server, a Dramatiq worker with the pump inside, recurring actors firing.

Run it with `emq-bridge demo` or `python -m emq_bridge.demo` (about 15 s; no service
needed: it starts its own Redis-protocol server unless given a URL, `emq-bridge --redis-url`
or `$REDIS_URL`). Every key it writes lives under one throwaway prefix, and every key under
it is deleted at the end. Each execution is printed as the actor runs it, with the slot it
serves; a summary follows.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..embedded import redis_url

QUEUE = "demo"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%H:%M:%S.%f")[:-3]


@dataclass
class Executions:
    """What the actors ran, printed as it happens (thread-safe: actors run on worker threads)."""

    started: float = field(default_factory=time.monotonic)
    by_name: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, actor: str, detail: str = "") -> None:
        from .schedule import current_occurrence

        occurrence = current_occurrence()
        now_ms = int(time.time() * 1000)
        if occurrence is None:
            return
        late_ms = now_ms - occurrence.due_ms
        with self.lock:
            runs = self.by_name.setdefault(occurrence.name, [])
            runs.append((occurrence.id, occurrence.due_ms, late_ms))
            print(
                f"  +{time.monotonic() - self.started:5.2f}s  {actor + detail:<22} "
                f"{occurrence.name:<14} slot {_clock(occurrence.due_ms)} UTC  "
                f"ran {late_ms:4d} ms after it  id {occurrence.id[:8]}",
                flush=True,
            )

    def ids(self) -> list[str]:
        with self.lock:
            return [i for runs in self.by_name.values() for i, _, _ in runs]


def _declare_actors(broker: Any, executions: Executions) -> dict[str, Any]:
    """Declare the demo's actors on `broker`; return them by name."""
    import dramatiq

    from .schedule import recurring

    @recurring(every="1s")
    @dramatiq.actor(broker=broker, queue_name=QUEUE)
    def heartbeat() -> None:
        executions.record("heartbeat()")

    @recurring(every="2s", name="digest-team", args=["team"])
    @recurring(every="3s", name="digest-ops", args=["ops"])
    @dramatiq.actor(broker=broker, queue_name=QUEUE)
    def send_digest(audience: str) -> None:
        executions.record("send_digest", f"({audience!r})")

    @recurring(cron="0 3 * * *", tz="Europe/Paris", name="nightly-report")
    @dramatiq.actor(broker=broker, queue_name=QUEUE)
    def nightly_report() -> None:
        executions.record("nightly_report()")

    return {"heartbeat": heartbeat, "send_digest": send_digest, "nightly_report": nightly_report}


def main(seconds: float = 12.0, url: str | None = None) -> None:
    """Run the demo for `seconds` on the server at `url` (else `$REDIS_URL`, else an embedded one).

    Its registry and its broker share one throwaway prefix, `emq-demo-<random>`, and every
    key under it is deleted at the end, even when the demo fails.
    """
    try:
        import dramatiq
        from dramatiq.brokers.redis import RedisBroker

        from .middleware import RecurringMiddleware, _address
        from .schedule import register
    except ImportError as exc:
        raise SystemExit(
            f"the demo needs Dramatiq: pip install 'emq-bridge[dramatiq,embedded]' ({exc})"
        ) from exc

    prefix = f"emq-demo-{uuid.uuid4().hex[:8]}"  # the registry's and the broker's
    with redis_url(url) as chosen:
        # RedisBroker's __init__ is unannotated in Dramatiq.
        broker = RedisBroker(url=chosen, namespace=prefix)  # type: ignore[no-untyped-call]
        print(f"Redis-protocol server at {_address(broker.client)}; keys under {prefix}")
        try:
            middleware = RecurringMiddleware(prefix=prefix, source="demo")
            broker.add_middleware(middleware)
            executions = Executions()
            actors = _declare_actors(broker, executions)

            print("Booting a Dramatiq worker; its boot syncs the declared schedules:")
            worker = dramatiq.Worker(broker, worker_threads=4, worker_timeout=100)
            worker.start()
            try:
                repeat = middleware.registry(broker)
                for line in middleware.plans[0].lines():
                    print(f"  {line}")
                added = register(
                    repeat, actors["send_digest"], every="5s", name="digest-adhoc", args=["adhoc"]
                )
                print(f"  + {QUEUE}/digest-adhoc  every 5s  (registered at runtime: {added})")
                print(f"The worker's pump thread fires them; executions for {seconds:.0f}s:")
                executions.started = time.monotonic()
                time.sleep(seconds)
            finally:
                worker.stop(timeout=10_000)
            _summary(repeat, executions, seconds)
        finally:
            # Everything the demo wrote: the registry, the queues, the workers' heartbeats.
            _remove_keys(broker.client, prefix)
            broker.close()


def _remove_keys(client: Any, prefix: str) -> None:
    """Delete every key under `prefix` (the demo's own, random: no one else's matches)."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 1000):
        client.delete(*keys[start : start + 1000])


def _summary(repeat: Any, executions: Executions, seconds: float) -> None:
    print(f"\nSummary after {seconds:.0f}s:")
    print(f"  {'schedule':<16}{'cadence':<32}{'runs':>5}  {'fired':>5}  next run (UTC)")
    for registration in sorted(repeat.list(QUEUE), key=lambda r: r.name):
        runs = len(executions.by_name.get(registration.name, []))
        next_run = datetime.fromtimestamp((registration.next_run_ms or 0) / 1000, tz=timezone.utc)
        print(
            f"  {registration.name:<16}{registration.definition.cadence.describe():<32}"
            f"{runs:>5}  {registration.fired:>5}  {next_run:%Y-%m-%d %H:%M:%S}"
        )
    ids = executions.ids()
    lateness = [late for runs in executions.by_name.values() for _, _, late in runs]
    mean = sum(lateness) / len(lateness) if lateness else 0.0
    print(
        f"  {len(ids)} executions, {len(set(ids))} distinct occurrence ids (runs: executed, "
        f"fired: enqueued by the pump); on average each ran {mean:.0f} ms after its slot."
    )


if __name__ == "__main__":
    main()
