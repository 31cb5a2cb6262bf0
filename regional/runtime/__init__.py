"""Shells around the pure core (DESIGN §3): the `driver` that owns the coordinator and carries out
its decisions, the `dispatch` port, the task side of an epoch (`task`, no Spark imports; its
parts `scheduling`, `state_reads`, `hot_state`, `state_upload` and `sink_staging`), the Spark
dispatcher (`spark`), the in-process one (`local`), the simulation (`sim`), `restore` and
`rescale`. Nothing here imports pyspark at import time; `regional.runtime.spark` imports it when
a runtime is built."""
