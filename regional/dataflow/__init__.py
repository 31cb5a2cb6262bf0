"""The task-side record path: the `pipeline` a user builds (sources, operators, sinks), operator
`state` and its `state_codec`, the durable keyed `exchange` and its `partitioning`, and
`dead_letters` for records user code could not process (`failures` says how a failure reads)."""
