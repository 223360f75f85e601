"""What the worker tells its operators: Prometheus metrics (metrics.py), trace spans from a request's timeline
(tracing.py) and the stall watchdog behind /health's `stalled` (watchdog.py). Imports nothing of the worker: the
top-level modules (app, service, pipeline, model) feed it."""
