"""Reading job-graph files: ours (JSON or TOML) and Flink's plan JSONs, told apart by content.

Our format has top-level `vertices` and `edges` whose keys are exactly the field names of
`regional.graph.job_graph.Vertex` and `Edge` (``from`` for `Edge.from_`); unknown keys are errors
naming
the file and the key path. A document with a `nodes` list (optionally wrapped in ``{"plan": ..}``)
is a Flink plan (`regional.graph.flink_plan`). Every failure is a `GraphError` that names the file.

>>> g = parse_graph(
...     b'vertices = [{id = "a", parallelism = 2}, {id = "b", parallelism = 2}]\\n'
...     b'edges = [{from = "a", to = "b", partitioner = "forward"}]\\n',
...     source="job.toml",
... )
>>> [e.partitioner for e in g.edges]
['forward']
>>> parse_graph(b'{"vertices": [{"id": "a", "parallelism": 1, "colour": "red"}]}', source="j.json")
Traceback (most recent call last):
regional.errors.GraphError: j.json: Object contains unknown field `colour` - at `$.vertices[0]`
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from metadata.bounded_read import byte_size, read_local_file
from regional.errors import GraphError
from regional.graph.flink_plan import graph_from_flink_plan, is_flink_plan
from regional.graph.job_graph import JobGraph

__all__ = ["MAX_GRAPH_FILE_BYTES", "load_graph", "parse_graph"]

#: The largest job-graph file read (64 MiB): far above the plan of any real job (a
#: 10,000-vertex graph is a few MiB), and a bound keeps a wrong path (`/dev/zero`, a FIFO) from
#: being read until memory runs out.
MAX_GRAPH_FILE_BYTES = 64 * 1024 * 1024


def _decode(data: bytes, source: str) -> Any:
    """JSON when the document starts with `{`, else TOML. The text is checked to be UTF-8 here,
    before a parser sees it, so the error never depends on a parser's wording."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GraphError(
            f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8 JSON or TOML"
        ) from None
    try:
        if text.lstrip()[:1] == "{":
            return msgspec.json.decode(text)
        return msgspec.toml.decode(text)
    except RecursionError:  # both parsers recurse once per level of nesting
        raise GraphError(
            f"{source}: nested too deeply to be read; a job graph nests objects and lists only "
            "a few levels deep"
        ) from None
    except msgspec.DecodeError as exc:
        raise GraphError(f"{source}: neither valid JSON nor TOML ({exc}); fix the syntax") from None


def parse_graph(data: bytes, *, source: str = "<graph>") -> JobGraph:
    """The job graph in `data` (ours in JSON/TOML, or a Flink plan JSON); `source` names it in
    errors."""
    obj = _decode(data, source)
    if not isinstance(obj, dict):
        raise GraphError(f"{source}: expected an object with `vertices` and `edges`")
    if "vertices" in obj:
        try:
            return msgspec.convert(obj, JobGraph)
        except (msgspec.ValidationError, GraphError) as exc:
            raise GraphError(f"{source}: {exc}") from None
    if is_flink_plan(obj):
        return graph_from_flink_plan(obj, source=source)
    raise GraphError(
        f"{source}: no `vertices` (our job-graph format) and no `nodes` (a Flink plan JSON); "
        "see examples/graphs/ for both"
    )


def load_graph(path: str | Path) -> JobGraph:
    """Read and validate the job-graph file at `path` (format detected from its content)."""
    try:
        data = read_local_file(path, MAX_GRAPH_FILE_BYTES)
    except OSError as exc:
        raise GraphError(f"{path}: cannot read the job-graph file: {exc.strerror}") from None
    if data is None:
        raise GraphError(
            f"{path}: larger than {byte_size(MAX_GRAPH_FILE_BYTES)}, the most a job-graph file "
            "may hold; pass a job-graph JSON/TOML or a Flink plan JSON"
        )
    return parse_graph(data, source=str(path))
