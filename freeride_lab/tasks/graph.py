"""Graph side tasks on a generated power-law graph: PageRank and SGD matrix factorisation.

FreeRide ran Gardenia's CUDA PageRank (pull) and SGD matrix factorisation (λ 0.05, step 0.003)
on SNAP com-Orkut (paper §12), one iteration per step. Here the graph is generated (nothing is
downloaded) and both kernels are written with torch ops, so they run on CPU or any GPU::

    >>> task = PageRankTask(n_nodes=1000, n_edges=5000)
    >>> task.setup(); task.to_device("cpu")
    >>> task.step()
    1.0
    >>> round(float(task.ranks.sum()), 6)
    1.0

[Note: Chung-Lu power-law graph]
Node i (1-based, before a random relabelling) has weight w_i = i^(-1/(gamma-1)), so expected degrees
follow a power law with exponent gamma (``exponent``, 2.1 by default: social graphs like com-Orkut
sit near 2-2.5). Each directed edge draws its source and its target independently with
probability proportional to w (inverse-CDF sampling, vectorised with ``np.searchsorted``).
Self-loops and duplicates are dropped and replaced by fresh draws until exactly ``n_edges``
distinct edges remain. The same ``(n_nodes, n_edges, exponent, seed)`` gives the same graph.

[Note: PageRank with dangling nodes]
Pull form, one sparse matrix-vector product per iteration::

    r' = d · M r + (d · Σ_{j dangling} r_j + 1 - d) / N,    M[v, u] = 1 / outdeg(u) for u → v

A dangling node (no out-edges) spreads its rank uniformly, as networkx does, so ``r`` keeps
summing to 1. ``M`` is a CSR tensor (rows = targets, the pull direction).

[Note: mini-batch SGD with conflicting updates]
An epoch visits every edge (u, v, rating) once in a seeded random order, in mini-batches of
``batch_edges``. Within a batch the per-edge SGD updates of a node are averaged, not summed:
a hub appears thousands of times in a large batch, and summing would multiply its step size by
that count and diverge. Gardenia's lock-free kernel loses most of the racing writes to a hub,
which is close to averaging. Ratings are a hidden rank-4 matrix plus noise (see
``edge_ratings``), so RMSE can fall well below its starting value.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import torch

from freeride_lab.tasks.device import HostReturningTask, releasing_device_cache
from freeride_lab.tasks.options import check_choice, check_float, check_int, resolve_options

__all__ = [
    "DTYPES",
    "GraphOptions",
    "PageRankOptions",
    "PageRankTask",
    "SGDMFOptions",
    "SGDMFTask",
    "edge_ratings",
    "power_law_graph",
    "pull_matrix",
]

#: Value dtypes the graph tasks accept.
DTYPES: tuple[str, ...] = ("float32", "float64")


@dataclass(frozen=True, kw_only=True)
class GraphOptions:
    """The generated graph (see [Note: Chung-Lu power-law graph]) and the value dtype."""

    n_nodes: int = 100_000
    n_edges: int = 1_000_000  # distinct directed edges, no self-loops
    exponent: float = 2.1  # power-law exponent gamma of the degree distribution
    seed: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_int("n_nodes", self.n_nodes, minimum=2)
        check_int("n_edges", self.n_edges)
        most = self.n_nodes * (self.n_nodes - 1) // 2
        if self.n_edges > most:
            raise ValueError(
                f"n_edges={self.n_edges} > n_nodes·(n_nodes-1)/2 = {most}: too dense for a "
                "sparse power-law graph; lower n_edges or raise n_nodes"
            )
        check_float("exponent", self.exponent, low=1.5, high=10.0)
        check_int("seed", self.seed, minimum=0)
        check_choice("dtype", self.dtype, DTYPES)


@dataclass(frozen=True, kw_only=True)
class PageRankOptions(GraphOptions):
    """PageRank settings on top of the graph."""

    damping: float = 0.85
    tol: float = 1e-6  # converged when the L1 change of one iteration is below it; 0: never
    max_iterations: int | None = 1000  # is_finished() after this many; None: no limit

    def __post_init__(self) -> None:
        super().__post_init__()
        check_float("damping", self.damping, low=0.0, high=1.0, low_open=True)
        check_float("tol", self.tol, low=0.0, high=1.0)
        check_int("max_iterations", self.max_iterations, optional=True)


@dataclass(frozen=True, kw_only=True)
class SGDMFOptions(GraphOptions):
    """Matrix-factorisation settings on top of the graph (Gardenia's λ and step)."""

    rank: int = 16  # latent factor dimension
    step_size: float = 0.003  # SGD learning rate (Gardenia: 0.003)
    reg: float = 0.05  # L2 regularisation λ (Gardenia: 0.05)
    batch_edges: int = 65_536  # edges per vectorised mini-batch
    max_epochs: int | None = None  # is_finished() after this many epochs; None: never

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("rank", self.rank)
        check_float("step_size", self.step_size, low=0.0, high=10.0, low_open=True)
        check_float("reg", self.reg, low=0.0, high=10.0)
        check_int("batch_edges", self.batch_edges)
        check_int("max_epochs", self.max_epochs, optional=True)


def power_law_graph(
    n_nodes: int, n_edges: int, *, exponent: float = 2.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Directed Chung-Lu graph (see [Note: Chung-Lu power-law graph]).

    Returns:
        (src, dst), two int64 arrays of ``n_edges`` node ids in ``[0, n_nodes)``, sorted by
        (src, dst), without self-loops or duplicates.
    """
    if n_edges > n_nodes * (n_nodes - 1) // 2:
        raise ValueError(f"n_edges={n_edges} is too many for n_nodes={n_nodes}")
    rng = np.random.default_rng(seed)
    weights = np.arange(1, n_nodes + 1, dtype=np.float64) ** (-1.0 / (exponent - 1.0))
    cdf = np.cumsum(weights)  # (N,)
    cdf /= cdf[-1]
    relabel = rng.permutation(n_nodes)  # hubs get random ids, not 0, 1, 2, …
    keys = np.empty(0, dtype=np.int64)  # src · N + dst, unique and sorted
    for _ in range(100):
        missing = n_edges - keys.size
        if missing <= 0:
            break
        draws = int(missing * 1.1) + 16
        src = relabel[np.searchsorted(cdf, rng.random(draws), side="right").clip(max=n_nodes - 1)]
        dst = relabel[np.searchsorted(cdf, rng.random(draws), side="right").clip(max=n_nodes - 1)]
        keep = src != dst
        keys = _sorted_unique(np.concatenate([keys, src[keep] * n_nodes + dst[keep]]))
    else:
        raise RuntimeError(
            f"could not draw {n_edges} distinct edges on {n_nodes} nodes with exponent "
            f"{exponent}; lower n_edges or the exponent's skew (raise exponent)"
        )
    if keys.size > n_edges:
        keys = np.sort(rng.choice(keys, size=n_edges, replace=False))
    return keys // n_nodes, keys % n_nodes


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct values (sort-based: ``np.unique``'s hashing is slower on 10⁶ ints)."""
    keys = np.sort(keys)
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))]


def pull_matrix(
    src: np.ndarray, dst: np.ndarray, n_nodes: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """PageRank's transition matrix in pull form (see [Note: PageRank with dangling nodes]).

    Returns:
        M, a sparse CSR (N, N) tensor with ``M[v, u] = 1/outdeg(u)`` for each edge u → v, and
        ``dangling``, an (N,) tensor of ``dtype`` that is 1 where a node has no out-edges.
    """
    out_degree = np.bincount(src, minlength=n_nodes)  # (N,)
    order = np.lexsort((src, dst))  # by target, then source
    rows, cols = dst[order], src[order]  # (E,), (E,)
    crow = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n_nodes), out=crow[1:])
    values = torch.from_numpy(1.0 / out_degree[cols]).to(dtype)  # (E,)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly")
        matrix = torch.sparse_csr_tensor(
            torch.from_numpy(crow),
            torch.from_numpy(cols),
            values,
            size=(n_nodes, n_nodes),
            check_invariants=False,  # built sorted and in range above
        )
    dangling = torch.from_numpy(out_degree == 0).to(dtype)  # (N,)
    return matrix, dangling


def edge_ratings(src: np.ndarray, dst: np.ndarray, n_nodes: int, *, seed: int = 0) -> np.ndarray:
    """Ratings in [1, 5] for each edge: 3 + (hidden rank-4 factors) + N(0, 0.1²) noise.

    Returns:
        (E,) float64 ratings, deterministic in ``seed``; about 1% are clipped at 1 or 5.
    """
    rng = np.random.default_rng(seed)
    users = rng.normal(0.0, 0.63, size=(n_nodes, 4))  # (N, 4): dot products have std ≈ 0.8
    items = rng.normal(0.0, 0.63, size=(n_nodes, 4))  # (N, 4)
    ratings = 3.0 + np.einsum("ek,ek->e", users[src], items[dst])  # (E,)
    ratings += rng.normal(0.0, 0.1, size=ratings.shape)
    clipped: np.ndarray = np.clip(ratings, 1.0, 5.0)
    return clipped


class _GraphTask(HostReturningTask):
    """Shared graph plumbing: options, device moves, tensor state. Unit: iterations."""

    unit: ClassVar[str] = "iterations"
    state_dict_is_copy: ClassVar[bool] = True  # host copies of the ``_saved`` tensors
    #: Key of FreeRide's reference throughput (paper §13) for cost accounting.
    reference_key: ClassVar[str]
    options_type: ClassVar[type[GraphOptions]]
    cpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    #: preset="gpu": a few million edges (com-Orkut itself has 3.1 M nodes, 117 M edges).
    gpu_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType(
        {"n_nodes": 1_000_000, "n_edges": 8_000_000}
    )
    #: Names of tensor attributes that ``to_device`` moves.
    _tensors: ClassVar[tuple[str, ...]]
    #: Of those, the ones that ``state_dict`` saves (host copies): the rest is regenerated.
    _saved: ClassVar[tuple[str, ...]]

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        presets = {"cpu": self.cpu_defaults, "gpu": self.gpu_defaults}
        self.config: GraphOptions = resolve_options(
            type(self).__name__, self.options_type, presets, options
        )
        self.iterations = 0
        self._ready = False

    @property
    def dtype(self) -> torch.dtype:
        """Torch dtype of values, ranks and factors."""
        return torch.float64 if self.config.dtype == "float64" else torch.float32

    def to_device(self, device: str) -> None:
        """Move the graph and the task's state onto ``device`` ("cpu", "cuda", "cuda:1")."""
        self._require_setup()
        target = torch.device(device)
        for name in self._tensors:
            setattr(self, name, getattr(self, name).to(target))
        self.device = str(target)

    def teardown(self) -> None:
        """Drop the graph and the state."""
        with releasing_device_cache(self.device):
            for name in self._tensors:
                setattr(self, name, None)
            self._ready = False

    def state_dict(self) -> dict[str, Any]:
        """Iterations done and the ``_saved`` tensors (host copies): exact resume."""
        self._require_setup()
        state: dict[str, Any] = {"progress": self.progress, "iterations": self.iterations}
        for name in self._saved:
            state[name] = getattr(self, name).detach().to("cpu", copy=True)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (after ``setup()``, on any device)."""
        self._require_setup()
        self.progress = float(state.get("progress", 0.0))
        self.iterations = int(state["iterations"])
        for name in self._saved:
            setattr(self, name, state[name].to(device=self.device, dtype=self.dtype))

    def _graph(self) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.config
        return power_law_graph(cfg.n_nodes, cfg.n_edges, exponent=cfg.exponent, seed=cfg.seed)

    def _require_setup(self) -> None:
        if not self._ready:
            raise RuntimeError(f"{type(self).__name__} has no graph yet; call setup() first")


class PageRankTask(_GraphTask):
    """Pull PageRank on a generated power-law graph; one step = one iteration."""

    reference_key = "pagerank"
    options_type = PageRankOptions
    #: preset="gpu": FreeRide-like open-ended run (no convergence stop), a few million edges.
    gpu_defaults = MappingProxyType(
        {"n_nodes": 1_000_000, "n_edges": 8_000_000, "tol": 0.0, "max_iterations": None}
    )
    _tensors = ("matrix", "dangling", "ranks")
    _saved = ("ranks",)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: PageRankOptions
        self.matrix: torch.Tensor = torch.empty(0)  # CSR (N, N), set by setup()
        self.dangling: torch.Tensor = torch.empty(0)  # (N,) 1 where outdeg = 0
        self.ranks: torch.Tensor = torch.empty(0)  # (N,) sums to 1
        self._delta: torch.Tensor | None = None  # L1 change of the latest iteration

    def __repr__(self) -> str:
        return (
            f"<PageRankTask n_nodes={self.config.n_nodes} n_edges={self.config.n_edges} "
            f"iterations={self.iterations} device={self.device!r}>"
        )

    @property
    def last_delta(self) -> float | None:
        """L1 change of the ranks in the latest iteration (None before the first)."""
        return None if self._delta is None else float(self._delta)

    def setup(self) -> None:
        """Generate the graph and build M, the dangling mask and uniform ranks on the host."""
        src, dst = self._graph()
        n = self.config.n_nodes
        self.matrix, self.dangling = pull_matrix(src, dst, n, self.dtype)
        self.ranks = torch.full((n,), 1.0 / n, dtype=self.dtype)
        self.device = "cpu"
        self._ready = True

    def step(self) -> float:
        """One PageRank iteration (see [Note: PageRank with dangling nodes]); returns 1."""
        self._require_setup()
        d, n = self.config.damping, self.config.n_nodes
        leaked = d * torch.dot(self.dangling, self.ranks) + (1.0 - d)  # scalar tensor
        new = torch.mv(self.matrix, self.ranks).mul_(d).add_(leaked / n)  # (N,)
        self._delta = (new - self.ranks).abs().sum()
        self.ranks = new
        self.iterations += 1
        return 1.0

    def is_finished(self) -> bool:
        """True once converged (L1 change < ``tol``) or ``max_iterations`` are done."""
        cfg = self.config
        if cfg.max_iterations is not None and self.iterations >= cfg.max_iterations:
            return True
        return cfg.tol > 0 and self._delta is not None and float(self._delta) < cfg.tol

    def state_dict(self) -> dict[str, Any]:
        """Iterations done, the ranks (host copy) and the latest change: exact resume."""
        return {**super().state_dict(), "last_delta": self.last_delta}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()`` (after ``setup()``, on any device)."""
        super().load_state_dict(state)
        delta = state.get("last_delta")
        self._delta = None if delta is None else torch.tensor(delta, dtype=self.dtype)


class SGDMFTask(_GraphTask):
    """SGD matrix factorisation of the graph's rated edges; one step = one epoch."""

    reference_key = "sgd"
    options_type = SGDMFOptions
    cpu_defaults = MappingProxyType({"n_nodes": 50_000, "n_edges": 250_000})
    gpu_defaults = MappingProxyType(
        {"n_nodes": 1_000_000, "n_edges": 8_000_000, "batch_edges": 1 << 20}
    )
    _tensors = ("users", "items", "ratings", "user_factors", "item_factors")
    _saved = ("user_factors", "item_factors")

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.config: SGDMFOptions
        self.users: torch.Tensor = torch.empty(0)  # (E,) int64 row (source) of each rating
        self.items: torch.Tensor = torch.empty(0)  # (E,) int64 column (target)
        self.ratings: torch.Tensor = torch.empty(0)  # (E,)
        self.user_factors: torch.Tensor = torch.empty(0)  # (N, rank)
        self.item_factors: torch.Tensor = torch.empty(0)  # (N, rank)

    def __repr__(self) -> str:
        return (
            f"<SGDMFTask n_nodes={self.config.n_nodes} n_edges={self.config.n_edges} "
            f"rank={self.config.rank} epochs={self.iterations} device={self.device!r}>"
        )

    def setup(self) -> None:
        """Generate graph, ratings and the initial factors on the host."""
        cfg = self.config
        src, dst = self._graph()
        ratings = edge_ratings(src, dst, cfg.n_nodes, seed=cfg.seed + 1)
        self.users, self.items = torch.from_numpy(src), torch.from_numpy(dst)
        self.ratings = torch.from_numpy(ratings).to(self.dtype)
        # uniform [0, a) factors with rank · (a/2)² = mean rating: predictions start near it
        scale = 2.0 * (float(ratings.mean()) / cfg.rank) ** 0.5
        g = torch.Generator().manual_seed(cfg.seed + 2)
        shape = (cfg.n_nodes, cfg.rank)
        self.user_factors = torch.rand(shape, generator=g, dtype=self.dtype) * scale
        self.item_factors = torch.rand(shape, generator=g, dtype=self.dtype) * scale
        self.device = "cpu"
        self._ready = True

    def step(self) -> float:
        """One epoch of mini-batch SGD over all edges; returns 1 (iteration)."""
        self._require_setup()
        cfg = self.config
        device = torch.device(self.device)
        g = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + self.iterations)
        order = torch.randperm(cfg.n_edges, generator=g, device=device)  # (E,)
        for start in range(0, cfg.n_edges, cfg.batch_edges):
            self._update(order[start : start + cfg.batch_edges])
        self.iterations += 1
        return 1.0

    def _update(self, batch: torch.Tensor) -> None:
        """SGD on the edges ``batch`` (b,), averaging a node's updates within the batch."""
        cfg = self.config
        # index_select, not fancy indexing: ~10x faster gathers on CPU
        u = self.users.index_select(0, batch)  # (b,)
        v = self.items.index_select(0, batch)  # (b,)
        p = self.user_factors.index_select(0, u)  # (b, K)
        q = self.item_factors.index_select(0, v)  # (b, K)
        err = (self.ratings.index_select(0, batch) - (p * q).sum(dim=1)).unsqueeze(1)  # (b, 1)
        grad_p = err * q - cfg.reg * p  # (b, K) descent direction
        grad_q = err * p - cfg.reg * q  # (b, K)
        n = cfg.n_nodes
        for factors, nodes, grad in (
            (self.user_factors, u, grad_p),
            (self.item_factors, v, grad_q),
        ):
            counts = torch.bincount(nodes, minlength=n).index_select(0, nodes)  # (b,) >= 1
            weight = (cfg.step_size / counts.to(grad.dtype)).unsqueeze(1)  # (b, 1)
            factors.index_add_(0, nodes, grad * weight)

    def rmse(self) -> float:
        """Root-mean-square error of the current factors over all rated edges."""
        self._require_setup()
        total = torch.zeros((), dtype=torch.float64, device=self.ratings.device)
        for start in range(0, self.config.n_edges, self.config.batch_edges):
            part = slice(start, start + self.config.batch_edges)
            p = self.user_factors.index_select(0, self.users[part])  # (b, K)
            q = self.item_factors.index_select(0, self.items[part])  # (b, K)
            total += ((self.ratings[part] - (p * q).sum(dim=1)) ** 2).sum().double()
        return float((total / self.config.n_edges).sqrt())

    def is_finished(self) -> bool:
        """True once ``max_epochs`` epochs are done (never when it is None)."""
        return self.config.max_epochs is not None and self.iterations >= self.config.max_epochs
