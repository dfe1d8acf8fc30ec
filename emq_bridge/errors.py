"""One small exception tree: everything emq-bridge raises derives from `EmqError`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "BrokerUnreachable",
    "ConfigError",
    "CorruptRecord",
    "DispatchError",
    "EmqError",
    "InvalidName",
    "PermanentDispatchError",
    "RegistryError",
    "RegistryOutOfMemory",
    "RegistryRedirected",
    "RegistryRestarted",
    "RegistryUnavailable",
    "ReportBatchError",
    "ReportBatchUnavailable",
    "ScheduleError",
    "UnknownRegistration",
]


class EmqError(Exception):
    """Root of every error emq-bridge raises."""


class ScheduleError(EmqError, ValueError):
    """A schedule definition is invalid: cadence, time zone, template or options."""


class InvalidName(ScheduleError):
    """A queue or registration name breaks the naming rules (see `emq_bridge.keys`)."""


class ConfigError(EmqError, ValueError):
    """A schedule file or adapter configuration is invalid."""


class RegistryError(EmqError):
    """The registry could not carry out a move."""


class RegistryUnavailable(RegistryError):
    """Redis could not be reached, answered with a connection-level error, or cannot serve
    the request while a failover is under way (CLUSTERDOWN, MASTERDOWN, TRYAGAIN, READONLY)."""


class RegistryOutOfMemory(RegistryUnavailable):
    """Redis refused a write: it is out of memory (`maxmemory` reached under `noeviction`,
    or a policy that found nothing to evict). A passing state, as an outage is: a pump retries
    with backoff and marks nothing lost meanwhile, workers keep their reports until Redis takes
    them again."""


class RegistryRedirected(RegistryError):
    """A Redis Cluster kept redirecting a move until the client gave up (redis-py's "TTL
    exhausted"): its slot migrating (a reshard) or its master failing over. It passes by
    itself; a pump retries that queue (every second) and serves its other queues meanwhile,
    and logs it at WARNING, once per spell."""


class RegistryRestarted(RegistryUnavailable):
    """The registry's Redis restarted (its `run_id` changed) during a move of many round
    trips, a sync: what it read before may be gone, so what it reports is not known to hold."""


class ReportBatchError(RegistryError):
    """The script calls of some queues of a report batch failed (`Repeat.report`); every
    other queue's call was still made.

    `queues` names the queues whose call failed and `unsent` counts their reports (not
    applied, or some of them only: a call may fail partway); `applied` counts the reports the
    other queues' calls applied.
    """

    def __init__(
        self, message: str, *, queues: Sequence[str] = (), applied: int = 0, unsent: int = 0
    ) -> None:
        # Defaults only so that pickle, which calls it with the message alone and then sets
        # the attributes, can rebuild it (a pool child's error sent to its parent).
        super().__init__(message)
        self.queues = tuple(queues)
        self.applied = applied
        self.unsent = unsent


class ReportBatchUnavailable(ReportBatchError, RegistryUnavailable):
    """A `ReportBatchError` where every failed call met an outage (`RegistryUnavailable`)."""


class CorruptRecord(RegistryError):
    """A registration hash lacks a field or holds a value of the wrong type."""


class DispatchError(EmqError):
    """A dispatcher could not hand an occurrence to its broker."""


class BrokerUnreachable(DispatchError):
    """The broker could not be reached (refused, reset, or no answer in time): not this
    occurrence's fault, and the next send would fail the same way. A pump sending a batch one
    occurrence at a time does not try the rest of it: they fail with this error, their leases
    kept, and are sent again when the leases expire, as any failed send is."""


class PermanentDispatchError(DispatchError):
    """An occurrence can never be sent as its registration stands, so retrying is pointless.

    An unknown task or actor, or a template the framework refuses. The pump parks the
    registration (it stops firing, `list`/`show` say why) until it is resumed; any other
    `DispatchError` is transient (a broker that is down) and retried after the lease.
    """


class UnknownRegistration(EmqError, KeyError):
    """No registration of that name in that queue (a `KeyError` too, as the moves that
    raise it have always said)."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr of it
        return str(self.args[0]) if self.args else "no such registration"
