"""Sinks committed exactly-once through the commit coordinator: `ParquetSink` (a Parquet table)
and `PaimonSink` (an Apache Paimon append table; needs the extra ``regional[paimon]``)."""
