"""A runnable Celery app scheduled by emq-bridge instead of Celery's own beat.

    cd examples && celery -A celery_app worker -B -l info     # one process: worker + beat
    cd examples && celery -A celery_app beat -l info          # or beat on its own (run many!)

It needs a Redis at $CELERY_BROKER_URL (default redis://127.0.0.1:6379/0); the schedule
registry lives there too.
"""

from .app import app

__all__ = ["app"]
