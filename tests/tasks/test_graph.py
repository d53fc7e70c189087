"""Generated power-law graph, PageRank and SGD matrix factorisation side tasks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from freeride_lab.tasks.graph import PageRankTask, SGDMFTask, power_law_graph

SMALL = {"n_nodes": 300, "n_edges": 1500, "seed": 3}


def _ready(cls: type, **options: object) -> PageRankTask:
    task = cls(**options)
    task.setup()
    task.to_device("cpu")
    return task


def _converged_ranks(**options: object) -> np.ndarray:
    task = _ready(PageRankTask, **SMALL, dtype="float64", tol=1e-14, max_iterations=500, **options)
    while not task.is_finished():
        task.step()
    return task.ranks.numpy()


def _dense_pagerank(src: np.ndarray, dst: np.ndarray, n: int, d: float = 0.85) -> np.ndarray:
    """Textbook power iteration on the dense column-stochastic matrix (dangling → uniform)."""
    adjacency = np.zeros((n, n))
    adjacency[dst, src] = 1.0  # column u holds u's out-edges
    out_degree = adjacency.sum(axis=0)
    transition = np.where(out_degree > 0, adjacency / np.maximum(out_degree, 1), 1.0 / n)
    google = d * transition + (1 - d) / n
    ranks = np.full(n, 1.0 / n)
    for _ in range(1000):
        ranks = google @ ranks
    return ranks


def test_graph_is_deterministic_simple_and_exactly_sized() -> None:
    src, dst = power_law_graph(2000, 10_000, seed=7)
    again = power_law_graph(2000, 10_000, seed=7)
    assert np.array_equal(src, again[0]) and np.array_equal(dst, again[1])
    assert src.size == 10_000
    assert not np.any(src == dst)
    assert np.unique(src * 2000 + dst).size == 10_000
    assert min(src.min(), dst.min()) >= 0 and max(src.max(), dst.max()) < 2000


def test_graph_degrees_are_heavy_tailed() -> None:
    _, dst = power_law_graph(20_000, 100_000, seed=0)
    in_degree = np.bincount(dst, minlength=20_000)
    assert in_degree.max() > 50 * in_degree.mean()


def test_other_seeds_give_other_graphs() -> None:
    assert not np.array_equal(
        power_law_graph(500, 2000, seed=0)[0], power_law_graph(500, 2000, seed=1)[0]
    )


def test_pagerank_ranks_sum_to_one() -> None:
    task = _ready(PageRankTask, n_nodes=5000, n_edges=25_000)
    for _ in range(5):
        assert task.step() == 1.0
        assert float(task.ranks.sum()) == pytest.approx(1.0, abs=1e-5)


def test_pagerank_matches_dense_power_iteration() -> None:
    src, dst = power_law_graph(SMALL["n_nodes"], SMALL["n_edges"], seed=SMALL["seed"])
    assert np.bincount(src, minlength=SMALL["n_nodes"]).min() == 0  # dangling nodes exist
    expected = _dense_pagerank(src, dst, SMALL["n_nodes"])
    np.testing.assert_allclose(_converged_ranks(), expected, rtol=0, atol=1e-6)


def test_pagerank_matches_networkx() -> None:
    nx = pytest.importorskip("networkx")
    src, dst = power_law_graph(SMALL["n_nodes"], SMALL["n_edges"], seed=SMALL["seed"])
    graph = nx.DiGraph()
    graph.add_nodes_from(range(SMALL["n_nodes"]))
    graph.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    try:
        import scipy  # noqa: F401  (nx.pagerank needs it)

        reference = nx.pagerank(graph, alpha=0.85, tol=1e-14, max_iter=1000)
    except ImportError:
        from networkx.algorithms.link_analysis import pagerank_alg

        reference = pagerank_alg._pagerank_python(graph, alpha=0.85, tol=1e-14, max_iter=1000)
    expected = np.array([reference[i] for i in range(SMALL["n_nodes"])])
    np.testing.assert_allclose(_converged_ranks(), expected, rtol=0, atol=1e-6)


def test_pagerank_finishes_when_the_change_drops_below_tol() -> None:
    task = _ready(PageRankTask, **SMALL, tol=1e-4, max_iterations=None)
    while not task.is_finished():
        task.step()
    assert task.last_delta is not None and task.last_delta < 1e-4
    assert 1 < task.iterations < 100


def test_pagerank_with_zero_tol_runs_exactly_max_iterations() -> None:
    task = _ready(PageRankTask, **SMALL, tol=0.0, max_iterations=30)
    while not task.is_finished():
        task.step()
    assert task.iterations == 30


def test_sgd_mf_rmse_falls_every_epoch_with_gardenia_settings() -> None:
    task = _ready(SGDMFTask, n_nodes=400, n_edges=4000, batch_edges=256, rank=8)
    rmse = [task.rmse()]
    for _ in range(8):
        assert task.step() == 1.0
        rmse.append(task.rmse())
    assert all(b < a for a, b in itertools.pairwise(rmse))
    assert rmse[-1] < 0.85 * rmse[0]


def test_sgd_mf_recovers_the_low_rank_ratings_with_a_larger_step() -> None:
    task = _ready(SGDMFTask, n_nodes=400, n_edges=4000, batch_edges=256, rank=8, step_size=0.1)
    start = task.rmse()
    for _ in range(20):
        task.step()
    assert task.rmse() < 0.3 * start  # the noise floor is 0.1


@pytest.mark.parametrize(
    ("cls", "options", "saved"),
    [
        (PageRankTask, SMALL, ("ranks",)),
        (
            SGDMFTask,
            {"n_nodes": 400, "n_edges": 4000, "batch_edges": 512},
            ("user_factors", "item_factors"),
        ),
    ],
    ids=["pagerank", "sgd_mf"],
)
def test_state_dict_round_trip_resumes_identically(
    cls: type, options: dict[str, object], saved: tuple[str, ...]
) -> None:
    original = _ready(cls, **options)
    original.step()
    state = original.state_dict()
    original.step()
    resumed = _ready(cls, **options)
    resumed.load_state_dict(state)
    resumed.step()
    for name in saved:
        assert torch.equal(getattr(resumed, name), getattr(original, name))
    assert resumed.iterations == 2


def test_sgd_mf_finishes_after_max_epochs() -> None:
    task = _ready(SGDMFTask, n_nodes=100, n_edges=500, max_epochs=2)
    task.step()
    assert not task.is_finished()
    task.step()
    assert task.is_finished()


def test_to_host_after_to_device_keeps_iterating() -> None:
    task = _ready(PageRankTask, **SMALL)
    task.step()
    task.to_host()
    task.to_device("cpu")
    task.step()
    assert task.device == "cpu" and task.iterations == 2


def test_too_dense_graph_is_rejected_with_a_fix() -> None:
    with pytest.raises(ValueError, match=r"PageRankTask: n_edges=100 > .* lower n_edges"):
        PageRankTask(n_nodes=10, n_edges=100)


def test_unknown_dtype_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"dtype='float16'.*'float32', 'float64'"):
        SGDMFTask(dtype="float16")


def test_gpu_presets_have_millions_of_edges_and_no_early_stop() -> None:
    cfg = PageRankTask(preset="gpu").config
    assert cfg.n_edges >= 1_000_000 and cfg.tol == 0.0 and cfg.max_iterations is None
    assert SGDMFTask(preset="gpu").config.n_edges >= 1_000_000


@pytest.mark.gpu
def test_pagerank_on_cuda_matches_cpu() -> None:
    expected = _converged_ranks()
    task = _ready(PageRankTask, **SMALL, dtype="float64", tol=1e-14, max_iterations=500)
    task.to_device("cuda")
    while not task.is_finished():
        task.step()
    np.testing.assert_allclose(task.ranks.cpu().numpy(), expected, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_sgd_mf_on_cuda_reduces_rmse() -> None:
    task = _ready(SGDMFTask, n_nodes=400, n_edges=4000, batch_edges=256, rank=8)
    task.to_device("cuda")
    start = task.rmse()
    for _ in range(5):
        task.step()
    assert task.rmse() < start
