"""A pytest plugin that writes each failure's report as it happens (``-p pytest_failure_log``
with ``scripts/`` on ``PYTHONPATH``; file: ``$IRIS_FW_FAILURE_LOG``, default ./failures.log).
pytest-xdist prints tracebacks only when the whole run ends: a GPU run cut off by its time
limit still leaves the tracebacks of the tests that failed before."""

import os


def pytest_runtest_logreport(report):
    # under pytest-xdist the worker writes its own failures; the controller, which sees the same
    # reports again (they carry the worker's node), does not
    if report.failed and (os.environ.get("PYTEST_XDIST_WORKER") or getattr(report, "node", None) is None):
        with open(os.environ.get("IRIS_FW_FAILURE_LOG", "failures.log"), "a") as f:
            f.write(f"===== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
