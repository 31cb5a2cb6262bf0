"""Why a Spark job of an epoch failed, in words a user can act on (issue 26).

A failed `collect` reaches the driver as a Py4J error whose first line is Spark's plumbing
(`An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.`);
the reason is further down (`Job aborted due to stage failure: Task 1 in stage 3.0 failed 1
times, most recent failure: Lost task 1.0 ... Python worker exited unexpectedly (crashed)`).
`spark_failure` finds the task that failed, names the units it ran and gives Spark's reason.
Pure: the text and the units per task come in.

>>> text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD."
...     "collectAndServe.\\n: org.apache.spark.SparkException: Job aborted due to stage failure: "
...     "Task 1 in stage 3.0 failed 1 times, most recent failure: Lost task 1.0 in stage 3.0 "
...     "(TID 7) (10.0.0.5 executor driver): org.apache.spark.SparkException: Python worker "
...     "exited unexpectedly (crashed). Consider setting 'spark.python.worker.faulthandler."
...     "enabled' for the better Python traceback.\\n\\tat org.apache.spark.api.python...")
>>> print(spark_failure(text, [[0, 1], [2, 3]]))  # doctest: +NORMALIZE_WHITESPACE
Spark lost the task running units 2, 3 (task 1 of the epoch's job, on executor driver):
Python worker exited unexpectedly (crashed)
>>> spark_failure("boom", [[0]])
'spark job failed: boom'
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from regional.coordinator.verdict import name_units

__all__ = ["spark_failure"]

_TASK = re.compile(r"Task (\d+) in stage [\d.]+ failed")
_LOST = re.compile(
    r"most recent failure: Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \(([^)]*)\): "
)
_KNOWN = (
    "Python worker exited unexpectedly (crashed)",
    "Python worker exited unexpectedly",
    "ExecutorLostFailure",
    "Connection reset by peer",
    "OutOfMemoryError",
    "Container killed",
)


def _reason(text: str) -> str:
    """Spark's reason: a known one where the text holds it, else the failure's first line."""
    for known in _KNOWN:
        if (at := text.find(known)) >= 0:
            line = text[at:].splitlines()[0]
            end = line.find(". ", len(known))  # Spark's hints follow the reason's sentence
            return (line if end < 0 else line[:end])[:300].rstrip()
    if (m := _LOST.search(text)) is not None:
        rest = text[m.end() :].splitlines()[0]
        return re.sub(r"^[\w.$]+(?:Exception|Error): ", "", rest)[:300]
    for line in text.splitlines():
        line = line.strip().lstrip(": ")
        if line and "error occurred while calling" not in line:
            return line[:300]
    return text.strip()[:300]


def spark_failure(text: str, units_by_task: Sequence[Sequence[int]]) -> str:
    """One line: which units the failed Spark task ran and why Spark says it failed.
    `units_by_task`: the units of each task of the job, in task order."""
    task = _TASK.search(text)
    if task is None or int(task[1]) >= len(units_by_task):
        return f"spark job failed: {_reason(text)}"
    index = int(task[1])
    lost = _LOST.search(text)
    where = ""
    if lost is not None and (executor := re.search(r"executor ([\w.-]+)", lost[1])):
        where = f", on executor {executor[1]}"
    return (
        f"Spark lost the task running {name_units(units_by_task[index])} (task {index} of the "
        f"epoch's job{where}): {_reason(text)}"
    )
