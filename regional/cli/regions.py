"""`regional regions GRAPH [--json]`: would this job benefit from regional checkpoints?

GRAPH is our job-graph file (JSON or TOML) or a Flink plan JSON (REST ``/jobs/<id>/plan`` or
``getExecutionPlan()``), told apart by content. For people: a verdict line, the warnings, one row
per vertex (when vertices have names) and one row per fallback unit (`--limit` rows of each); a
note per durable exchange (`regional.dataflow.exchange`) saying why its two sides fall back on
their own.
With `--json`: one object with `regional_allowed`, `reason`, `num_regions`, `num_units`, `units`
and `regions` (lists of ``"<vertex_id>#<index>"`` lists, each sorted by vertex id then index, in
id order), `warnings`, `notes` and `graph_fingerprint`. A bad graph exits with 2 and one line on
stderr. A PIPELINE.py loads with `REGIONAL_CHECKPOINT_DIR` set as under `regional run`
(`--checkpoint-dir`, else the root `run` uses by default), so a file that reads it loads.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pyarrow as pa

from regional.cli.render import print_table, say
from regional.errors import GraphError
from regional.graph.files import load_graph
from regional.graph.job_graph import JobGraph
from regional.graph.regions import RegionPlan, Subtask, analyse

__all__ = ["plan_json", "register"]

_MEMBERS_WIDTH = 72
#: What `regional run` (and `regions` for a PIPELINE.py) sets to the checkpoint root.
CHECKPOINT_DIR_ENV = "REGIONAL_CHECKPOINT_DIR"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `regions`."""
    parser = subparsers.add_parser(
        "regions",
        help="analyse a job graph's regions and fallback units",
        description="Compute the pipelined regions and fallback units of GRAPH (our JSON/TOML "
        "job graph, a Flink plan JSON, or a PIPELINE.py file as `regional run` loads it: its "
        "module-level `pipeline`) and say whether regional checkpoints can run.",
    )
    parser.add_argument(
        "graph", metavar="GRAPH", type=Path, help="job-graph, Flink plan or pipeline (.py) file"
    )
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="for a PIPELINE.py: the checkpoint root put in the environment as "
        "REGIONAL_CHECKPOINT_DIR while the file loads, as `regional run` does (default: the "
        "one `regional run FILE` uses without options, .regional/checkpoints in the file's "
        "folder; nothing is created there)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--limit",
        type=int,
        default=50,
        metavar="N",
        help="show at most N vertex rows and N unit rows (0: all; default 50)",
    )
    parser.set_defaults(handler=show_regions)


def show_regions(args: argparse.Namespace) -> int:
    """Load, analyse and print `args.graph` (a `.py` file: the graph of its `pipeline`)."""
    schemas: dict[str, str] = {}
    if args.graph.suffix == ".py":
        graph, schemas = _pipeline_graph(args.graph, args.checkpoint_dir)
    else:
        graph = load_graph(args.graph)
    plan = analyse(graph)
    if args.json:
        sys.stdout.write(msgspec.json.encode(plan_json(plan)).decode() + "\n")
        return 0
    verdict = "yes" if plan.regional_allowed else f"no: {plan.reason}"
    say(
        f"{args.graph}: {len(graph.vertices)} vertices, {graph.num_subtasks} subtasks, "
        f"{plan.num_regions} regions, {plan.num_units} fallback units; "
        f"regional checkpoints: {verdict}"
    )
    for warning in plan.warnings:
        say(f"warning: {warning}")
    for note in plan.notes:
        say(f"note: {note}")
    limit = args.limit if args.limit > 0 else None
    if any(v.name != v.id for v in graph.vertices):
        vertices = graph.topological_order()[:limit]
        print_table(_vertex_table(plan, vertices), as_json=False)
        if len(vertices) < len(graph.vertices):
            say(f"... {len(graph.vertices) - len(vertices)} more vertices (--limit 0 shows all)")
        say()
    for vertex, schema in list(schemas.items())[:limit]:
        say(f"schema of {vertex}: {schema}")
    if schemas:
        say()
    shown = min(limit or plan.num_units, plan.num_units)
    rows = [_unit_row(plan, u) for u in range(shown)]
    table = pa.table(
        {
            "unit": pa.array([r[0] for r in rows], pa.int64()),
            "regions": pa.array([r[1] for r in rows], pa.int64()),
            "subtasks": pa.array([r[2] for r in rows], pa.int64()),
            "members": pa.array([r[3] for r in rows], pa.string()),
        }
    )
    print_table(table, as_json=False)
    if shown < plan.num_units:
        say(f"... {plan.num_units - shown} more units (--limit 0 shows all, --json lists them)")
    return 0


def _pipeline_graph(file: Path, checkpoint_dir: str | None) -> tuple[JobGraph, dict[str, str]]:
    """The job graph of the `pipeline` a PIPELINE.py defines, loaded as `regional run` loads
    it (`regional.cli.run.load_pipeline_file`), with `REGIONAL_CHECKPOINT_DIR` set while it
    loads, as `run` sets it: `checkpoint_dir`, else the root `regional run FILE` uses without
    options (`default_checkpoint_root`; only named, never created); `GraphError` naming the
    file otherwise. With it, the schema of each vertex that has one (`PlannedVertex.schema`),
    as text."""
    from regional.cli.run import default_checkpoint_root, load_pipeline_file
    from regional.dataflow.pipeline import Pipeline
    from regional.dataflow.plan import compile_plan

    before = os.environ.get(CHECKPOINT_DIR_ENV)
    os.environ[CHECKPOINT_DIR_ENV] = checkpoint_dir or default_checkpoint_root(file)
    try:
        namespace = load_pipeline_file(file)
    finally:  # this process's environment as it was (main() may run again in it)
        if before is None:
            os.environ.pop(CHECKPOINT_DIR_ENV, None)
        else:
            os.environ[CHECKPOINT_DIR_ENV] = before
    pipeline = namespace.get("pipeline")
    if not isinstance(pipeline, Pipeline):
        raise GraphError(
            f"{file} defines no module-level `pipeline` (a regional.Pipeline); assign one, "
            "e.g. `pipeline = Pipeline('clicks')`"
        )
    graph = pipeline.job_graph()
    planned = compile_plan(pipeline).vertices
    schemas = {
        v: ", ".join(f"{f.name} {f.type}" for f in schema)
        for v in graph.topological_order()
        if (schema := planned[v].schema) is not None
    }
    return graph, schemas


def _vertex_table(plan: RegionPlan, ids: Sequence[str]) -> pa.Table:
    """One row per vertex: id, name, kind, parallelism, how many units its subtasks span."""
    vertices = [plan.graph.vertex(v) for v in ids]
    return pa.table(
        {
            "vertex": [v.id for v in vertices],
            "name": [v.name for v in vertices],
            "kind": [v.kind for v in vertices],
            "parallelism": pa.array([v.parallelism for v in vertices], pa.int64()),
            "units": pa.array(
                [len({plan.unit_of(v.id, i) for i in range(v.parallelism)}) for v in vertices],
                pa.int64(),
            ),
        }
    )


def _unit_row(plan: RegionPlan, unit: int) -> tuple[int, int, int, str]:
    members = plan.subtasks_of_unit(unit)
    return unit, len(plan.regions_of_unit(unit)), len(members), _compact(members)


def _compact(members: Sequence[Subtask]) -> str:
    """``a#0-2, b#1`` for a#0, a#1, a#2, b#1; cut at `_MEMBERS_WIDTH` characters."""
    parts: list[str] = []
    for vertex, group in itertools.groupby(members, key=lambda s: s.vertex_id):
        indices = [s.index for s in group]
        runs = itertools.groupby(enumerate(indices), key=lambda t: t[1] - t[0])
        for _, run in runs:
            first, *rest = [i for _, i in run]
            parts.append(f"{vertex}#{first}-{rest[-1]}" if rest else f"{vertex}#{first}")
    text = ", ".join(parts)
    return text if len(text) <= _MEMBERS_WIDTH else text[: _MEMBERS_WIDTH - 3] + "..."


def _listing(groups: Sequence[Sequence[Subtask]]) -> list[list[str]]:
    return [[str(s) for s in sorted(group)] for group in groups]


def plan_json(plan: RegionPlan) -> dict[str, object]:
    """The `--json` object of a plan."""
    return {
        "regional_allowed": plan.regional_allowed,
        "reason": plan.reason,
        "num_regions": plan.num_regions,
        "num_units": plan.num_units,
        "units": _listing(plan.units),
        "regions": _listing(plan.regions),
        "warnings": list(plan.warnings),
        "notes": list(plan.notes),
        "graph_fingerprint": plan.graph.fingerprint(),
    }
