"""Region analysis at scale: time and peak memory of `regional.graph.regions.analyse`.

Cases: (a) a 1,000-vertex forward chain at parallelism 1,000 (one million subtasks), (b) 200
vertices at parallelism 500 joined by hash edges, (c) a random DAG of 5,000 vertices (seeded;
parallelism 1-64, 1-2 inputs per vertex, every partitioner and exchange). Target: each under
1 s and 200 MB. Time is the best of 3 runs without tracing; peak memory is traced separately
with `tracemalloc` (Python allocations made by the analysis, not the input graph); RSS MB is
the whole process's peak resident memory so far (interpreter, input graphs and all). Extra case
(d), the worst case for the representation: a forward chain of hybrid edges, where every one of
the million subtasks is its own region.

Run: ``.venv/bin/python -m benchmarks.bench_regions [--quick]`` (``--quick``: every case a tenth
of the size).
"""

from __future__ import annotations

import argparse
import random
import resource
import time
import tracemalloc
from collections.abc import Callable

from regional.graph.job_graph import Edge, Exchange, JobGraph, Partitioner, Vertex
from regional.graph.regions import analyse

PARTITIONERS: tuple[Partitioner, ...] = (
    "forward",
    "rescale",
    "rebalance",
    "hash",
    "broadcast",
    "global",
    "custom",
)
EXCHANGES: tuple[Exchange, ...] = (
    "pipelined",
    "pipelined_bounded",
    "blocking",
    "hybrid_full",
    "hybrid_selective",
)


def forward_chain(n: int = 1000, p: int = 1000) -> JobGraph:
    vertices = tuple(Vertex(f"v{i:04}", p) for i in range(n))
    edges = tuple(Edge(f"v{i:04}", f"v{i + 1:04}", "forward") for i in range(n - 1))
    return JobGraph(vertices=vertices, edges=edges)


def hash_chain(n: int = 200, p: int = 500) -> JobGraph:
    vertices = tuple(Vertex(f"v{i:03}", p) for i in range(n))
    edges = tuple(Edge(f"v{i:03}", f"v{i + 1:03}", "hash") for i in range(n - 1))
    return JobGraph(vertices=vertices, edges=edges)


def hybrid_chain(n: int = 1000, p: int = 1000) -> JobGraph:
    vertices = tuple(Vertex(f"v{i:04}", p) for i in range(n))
    edges = tuple(Edge(f"v{i:04}", f"v{i + 1:04}", "forward", "hybrid_full") for i in range(n - 1))
    return JobGraph(vertices=vertices, edges=edges)


def random_dag(n: int = 5000, seed: int = 7) -> JobGraph:
    rnd = random.Random(seed)
    par = [rnd.choice((1, 2, 4, 8, 16, 32, 64, rnd.randint(1, 64))) for _ in range(n)]
    edges = []
    for j in range(1, n):
        for i in {rnd.randrange(max(0, j - 50), j) for _ in range(rnd.randint(1, 2))}:
            partitioner: Partitioner = rnd.choice(PARTITIONERS)
            if partitioner == "forward" and par[i] != par[j]:
                partitioner = "rescale"
            edges.append(Edge(f"v{i:05}", f"v{j:05}", partitioner, rnd.choice(EXCHANGES)))
    vertices = tuple(Vertex(f"v{i:05}", par[i]) for i in range(n))
    return JobGraph(vertices=vertices, edges=tuple(edges))


def measure(build: Callable[[], JobGraph]) -> tuple[int, int, int, int, float, float]:
    graph = build()
    graph.topological_order()  # part of the graph, not the analysis
    times = []
    for _ in range(3):
        start = time.perf_counter()
        plan = analyse(graph)
        times.append(time.perf_counter() - start)
    tracemalloc.start()
    traced = analyse(graph)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (traced.num_regions, traced.num_units) == (plan.num_regions, plan.num_units)
    return (
        len(graph.vertices),
        graph.num_subtasks,
        plan.num_regions,
        plan.num_units,
        min(times),
        peak / 2**20,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every case a tenth of the size")
    args = parser.parse_args()
    cases: list[tuple[str, Callable[[], JobGraph]]] = [
        ("(a) forward chain 1,000 x p=1,000", forward_chain),
        ("(b) hash chain 200 x p=500", hash_chain),
        ("(c) random DAG 5,000 vertices", random_dag),
        ("(d) hybrid forward chain 1,000 x 1,000", hybrid_chain),
    ]
    if args.quick:
        cases = [
            ("(a) forward chain 100 x p=100", lambda: forward_chain(100, 100)),
            ("(b) hash chain 20 x p=50", lambda: hash_chain(20, 50)),
            ("(c) random DAG 500 vertices", lambda: random_dag(500)),
            ("(d) hybrid forward chain 100 x 100", lambda: hybrid_chain(100, 100)),
        ]
    header = f"{'case':<40} {'vertices':>8} {'subtasks':>9} {'regions':>9} {'units':>7}"
    print(header + f" {'time s':>7} {'peak MB':>8} {'RSS MB':>7}")
    print("-" * (len(header) + 25))
    for name, build in cases:
        v, s, r, u, t, mb = measure(build)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{name:<40} {v:>8,} {s:>9,} {r:>9,} {u:>7,} {t:>7.3f} {mb:>8.1f} {rss:>7.0f}")


if __name__ == "__main__":
    main()
