"""`emq-bridge show` tells how many backfilled slots the claim dropped unsent (the schedule
could no longer have them): the record counted them in `backfill_dropped`, which neither the
text nor the JSON showed, so a user whose backfill sent fewer slots than it queued had no
way to learn why but reading the hash by hand."""

from __future__ import annotations

import json

from cli_runs import Run, cli_runner

from emq_bridge import Pump, Repeat
from emq_bridge.definition import define
from emq_bridge.testing import RecordingDispatcher

H = 3_600_000
T0 = 1_893_499_200_000  # 2030-01-01T12:00Z
HOURLY = {"every": "1h", "misfire": "skip", "template": {"task": "t"}}


def test_show_counts_the_backfilled_slots_dropped_unsent(
    repeat: Repeat, redis_url: str, prefix: str
) -> None:
    run: Run = cli_runner(redis_url, prefix)
    repeat.upsert("q", "n", definition=define(**HOURLY), now_ms=T0)
    repeat.upsert("q", "quiet", definition=define(**HOURLY), now_ms=T0)
    assert len(repeat.backfill("q", "n", T0 - 10 * H, T0 - H, rate=1, now_ms=T0).queued) == 10
    recorder = RecordingDispatcher()
    pump = Pump(repeat, ["q"], recorder)
    pump.run_once(T0 + 500)  # the first slot sent; then a limit: the nine others dropped
    repeat.upsert("q", "n", definition=define(**HOURLY, limit=2), now_ms=T0 + 600)
    for second in range(1, 15):
        pump.run_once(T0 + second * 1000)
    assert len([o for o in recorder.occurrences if o.backfill]) == 1

    shown = run("show", "q", "n")
    assert shown.exit_code == 0, shown.output
    assert "  dropped   9 backfilled slot(s) the schedule no longer has, unsent" in shown.output
    as_json = run("show", "q", "n", "--json")
    assert json.loads(as_json.output)["backfill_dropped"] == 9
    assert repeat.get("q", "n").backfill_dropped == 9

    # None dropped: no line, and 0 in the JSON.
    quiet = run("show", "q", "quiet")
    assert quiet.exit_code == 0 and "dropped" not in quiet.output
    assert json.loads(run("show", "q", "quiet", "--json").output)["backfill_dropped"] == 0
