"""Runtimes: the quiet SparkSession (`session`), the task-side protocol of an epoch (`task`,
no Spark imports) and the Spark driver loop (`spark`). Nothing here imports pyspark at import
time; `regional.runtime.spark` imports it when a runtime is built."""
