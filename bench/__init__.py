"""emq-bridge's benchmarks against celery-redbeat and Celery's PersistentScheduler.

Not part of the installed package. Run `python -m bench` (or `python -m bench --quick`).
"""
