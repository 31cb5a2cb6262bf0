"""The job graph and its analysis (DESIGN §4 rule 1): `job_graph` (vertices, edges, partitioners),
`regions` (pipeline regions and fallback units), `files` (graph files in TOML/JSON) and
`flink_plan` (a Flink job plan read as a job graph). Pure: no Spark, no file system."""
