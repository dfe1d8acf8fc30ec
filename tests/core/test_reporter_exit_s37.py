"""A process that ends without closing its `Reporter` still sends what it queued (found by a
probe of fork safety, session 37: a script that reported and returned lost every report, since
the sending thread is a daemon that dies with the interpreter). An exit hook flushes the
process's reporters, for at most `EXIT_FLUSH_S`. A real process, a real server."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from emq_bridge import Repeat, occurrence_id

SCRIPT = textwrap.dedent("""
    import sys

    import redis
    from emq_bridge import Repeat, Report
    from emq_bridge.reporting import Reporter

    url, prefix, ident, due = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    reporter = Reporter(Repeat(redis.Redis.from_url(url), prefix))
    start = Report("started", "q", "job", ident, due, due + 1_000)
    reporter.report(start)
    reporter.finish(start, "succeeded", due + 2_000)
    # no close(), no flush(): the script just ends
""")


def test_a_process_that_ends_without_closing_its_reporter_sends_what_it_queued(
    repeat: Repeat, redis_url: str
) -> None:
    due = repeat.server_time_ms() - 60_000
    repeat.upsert("q", "job", every="1h", template={"task": "t"}, now_ms=due - 1)
    ident = occurrence_id(repeat.prefix, "q", "job", due)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_url, repeat.prefix, ident, str(due)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert [(e.id, e.status) for e in repeat.history("q", "job")] == [(ident, "succeeded")]
