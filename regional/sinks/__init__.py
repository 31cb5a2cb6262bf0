"""Sinks: `ParquetSink`, an exactly-once Parquet table committed through the commit coordinator."""
