import math

import numpy as np
import pytest

from analysis.estimators.entropy import exact_entropy_from_logprobs, grouped_tail_entropy, tail_mass


def test_uniform_topk_without_tail():
    k = 20
    H = grouped_tail_entropy(np.full((k,), math.log(1 / k)))
    assert H == pytest.approx(math.log(k))


def test_uniform_topk_with_tail():
    # 20 tokens of 0.04 each, tail mass 0.2 in one bin
    lp = np.full((20,), math.log(0.04))
    expected = -20 * 0.04 * math.log(0.04) - 0.2 * math.log(0.2)
    assert grouped_tail_entropy(lp) == pytest.approx(expected)
    assert tail_mass(lp) == pytest.approx(0.2)


def test_one_hot_is_zero():
    lp = np.array([0.0] + [-np.inf] * 19)
    assert grouped_tail_entropy(lp) == pytest.approx(0.0, abs=1e-12)


def test_sum_exceeding_one_by_rounding_clips_tail():
    lp = np.log(np.array([0.5, 0.3, 0.2000004]))
    H = grouped_tail_entropy(lp)
    expected = -sum(p * math.log(p) for p in [0.5, 0.3, 0.2000004])
    assert H == pytest.approx(expected)
    assert np.isfinite(H)


def test_vectorised_shapes_and_nan_padding():
    a = np.log(np.array([[0.5, 0.25, np.nan], [0.9, 0.05, 0.05]]))
    H = grouped_tail_entropy(np.stack([a, a]))
    assert H.shape == (2, 2)
    row0 = -(0.5 * math.log(0.5) + 0.25 * math.log(0.25) + 0.25 * math.log(0.25))
    assert H[0, 0] == pytest.approx(row0)
    assert H[1, 1] == pytest.approx(-(0.9 * math.log(0.9) + 2 * 0.05 * math.log(0.05)))


def test_grouped_is_lower_bound_of_exact():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(200, 500)) * 3
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    top = -np.sort(-lp, axis=-1)[:, :20]
    assert (exact_entropy_from_logprobs(lp) >= grouped_tail_entropy(top) - 1e-12).all()


def test_think_segment_entropy_per_call():
    import math

    from analysis.estimators.entropy import think_segment_entropy

    k = 4
    uniform4 = [math.log(0.25)] * k          # H = log 4
    onehot = [0.0] + [float("-inf")] * (k - 1)  # H = 0
    half_tail = [math.log(0.125)] * k        # 4 x 1/8 + tail 1/2
    h_half = -4 * 0.125 * math.log(0.125) - 0.5 * math.log(0.5)
    call = [1, 1, 1, 2, 2, 3, 3]
    top = [uniform4, onehot, uniform4, half_tail, uniform4, uniform4, uniform4]
    think = [True, True, False, True, False, False, False]  # call 1: 2 think tokens; call 3: none
    exact = [math.log(4), 0.0, math.log(4), 2.0, 1.0, 1.0, 1.0]
    out = think_segment_entropy(call, top, think, exact)
    assert list(out["call"]) == [1, 2, 3] and list(out["n_think"]) == [2, 1, 0]
    assert out["H"][0] == pytest.approx(math.log(4) / 2)     # the answer token of call 1 is excluded
    assert out["H"][1] == pytest.approx(h_half) and np.isnan(out["H"][2])
    assert out["H_exact"][1] == pytest.approx(2.0) and out["gap"][1] == pytest.approx(2.0 - h_half)
    assert out["gap"][0] == pytest.approx(0.0)


def test_float32_input_matches_float64():
    rng = np.random.default_rng(1)
    p = np.sort(rng.dirichlet(np.full(50, 0.3), size=500), axis=1)[:, ::-1][:, :20]
    lp64 = np.log(p)
    lp32 = lp64.astype(np.float32)
    assert np.abs(grouped_tail_entropy(lp32) - grouped_tail_entropy(lp32.astype(np.float64))).max() < 1e-5


def test_entropy_bounds_hold_the_exact_entropy_and_are_tight_without_a_tail():
    """The grouped lower bound and the even-tail upper bound (analysis.estimators.entropy.entropy_bounds) against exact
    entropies of random distributions, flat to peaked, over several vocabulary sizes: never violated; equal
    when the top-k is the whole vocabulary (no tail) or leaves one token."""
    from analysis.estimators.entropy import entropy_bounds, grouped_tail_entropy

    rng = np.random.default_rng(0)
    k = 20
    for V in (21, 50, 1000, 5000):
        for alpha in (0.01, 0.1, 1.0, 10.0):
            p = rng.dirichlet(np.full(V, alpha), size=200)
            exact = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
            with np.errstate(divide="ignore"):  # exact zeros (alpha 0.01): -inf, read as absent
                top = np.log(np.sort(p, axis=1)[:, ::-1][:, :k])
            low, high = entropy_bounds(top, V)
            assert np.all(low <= exact + 1e-9) and np.all(exact <= high + 1e-9), (V, alpha)
            assert np.allclose(low, grouped_tail_entropy(top))
            if V == 21:  # one token in the tail: its probability is the tail mass, both bounds exact
                assert np.allclose(low, exact) and np.allclose(high, exact)
    # uniform over V: the upper bound is exact (log V), the lower one is not
    V = 1000
    top = np.full((1, k), -math.log(V))
    low, high = entropy_bounds(top, V)
    assert math.isclose(float(high[0]), math.log(V), rel_tol=1e-12) and float(low[0]) < math.log(V) - 1
    # no tail: the whole vocabulary is listed (k = V), bounds equal the exact value; padding ignored
    p = rng.dirichlet(np.ones(k))
    low, high = entropy_bounds(np.log(p)[None, :], k)
    assert math.isclose(float(low[0]), float(high[0])) and math.isclose(float(low[0]), float(-(p * np.log(p)).sum()))
    padded = np.r_[np.log(p[:10]), [np.nan] * 10][None, :]
    lo, hi = entropy_bounds(padded, 5000)
    assert lo[0] < hi[0]
    with pytest.raises(ValueError, match="vocab"):
        entropy_bounds(top, 0)


def test_forking_threshold_takes_the_top_fifth_and_the_parts_add_up():
    """The histogram route (entropy_histogram → forking_threshold → forking_stats) picks, at 0.05-nat resolution,
    the highest threshold that keeps at least 20 % of the run's tokens, and the forking tokens' summed entropy /
    dH are those of the tokens at or above it."""
    from analysis.estimators.entropy import FORK_BIN, entropy_histogram, forking_stats, forking_threshold

    rng = np.random.default_rng(1)
    steps = [rng.gamma(2.0, 0.6, size=n) for n in (50, 300, 700)]
    dHs = [rng.normal(0, 0.3, size=len(h)) for h in steps]
    hists = [entropy_histogram(h, d) for h, d in zip(steps, dHs)]
    j, theta = forking_threshold(hists)
    allH = np.concatenate(steps)
    share = (np.floor(allH / FORK_BIN) >= j).mean()
    assert share >= 0.20 and (np.floor(allH / FORK_BIN) >= j + 1).mean() < 0.20   # the highest such bin
    assert theta == j * FORK_BIN and abs(np.quantile(allH, 0.8) - theta) <= FORK_BIN
    for h, d, hist in zip(steps, dHs, hists):
        fork = np.floor(h / FORK_BIN) >= j
        n, nf, sf, df = forking_stats(hist, j)
        assert (n, nf) == (len(h), int(fork.sum()))
        assert np.isclose(sf, h[fork].sum(), atol=1e-4) and np.isclose(df, d[fork].sum(), atol=1e-4)
    empty = forking_stats(None, j)
    assert empty[:3] == (0, 0, 0.0) and np.isnan(empty[3])
    assert np.isnan(forking_threshold([])[1])


def _top_rows(rng, trial: int):
    """(n, k) sorted top-k logprobs of random peaked-to-flat distributions, some with probabilities that underflow
    (trial % 3 == 0) or a logprob rounded above 0 (trial % 4 == 0), and a vocabulary with no, one or many tail
    tokens."""
    n, k = int(rng.integers(1, 300)), int(rng.integers(1, 25))
    g = rng.gamma(rng.uniform(0.01, 2.0), size=(n, k + int(rng.integers(0, 50))))
    p = -np.sort(-(g / g.sum(axis=1, keepdims=True)), axis=1)[:, :k]
    lp = np.log(np.maximum(p, 1e-320))
    if trial % 3 == 0:
        lp[rng.random(lp.shape) < 0.05] = -800.0  # exp underflows to 0
    if trial % 4 == 0:
        lp[:, 0] = 1e-7  # above 0 by rounding
    return lp, int(rng.choice([k, k + 1, 1000, 248_320]))


def test_entropy_bounds_of_full_rows_equal_the_masked_arithmetic():
    """Rows with every alternative listed take a path without masks (analysis.estimators.entropy._bounds_full): the same
    values as the masked arithmetic (reached by appending one absent alternative, which changes nothing), also
    with underflowed probabilities, a logprob rounded above 0, and vocabularies with no or one tail token."""
    from analysis.estimators.entropy import _bounds_full, entropy_bounds

    rng = np.random.default_rng(3)
    for trial in range(24):
        lp, V = _top_rows(rng, trial)
        n = len(lp)
        fast = entropy_bounds(lp, V)
        masked = entropy_bounds(np.concatenate([lp, np.full((n, 1), np.nan)], axis=1), V)
        assert all(np.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(fast, masked)), trial
        assert all(np.array_equal(a, b) for a, b in zip(fast, _bounds_full(lp, V)))


def test_the_upper_bound_from_the_grouped_entropy_equals_entropy_bounds():
    """token_influence takes the upper bound from the grouped-tail entropy it already has (analysis.estimators.entropy.
    entropy_high): the same values as entropy_bounds, also with underflowed probabilities, a logprob rounded
    above 0, an empty tail, vocabularies with no or one tail token, and a row with an absent entry (which takes
    entropy_bounds itself)."""
    from analysis.estimators.entropy import entropy_bounds, entropy_high, grouped_tail_entropy

    rng = np.random.default_rng(4)
    for trial in range(24):
        lp, V = _top_rows(rng, trial)
        k = lp.shape[1]
        if trial % 5 == 0:
            lp[0] = np.log(np.full(k, 1.0 / k))  # no tail at all
        if trial % 6 == 0:
            lp[-1, -1] = np.nan
        got = entropy_high(lp, grouped_tail_entropy(lp), V)
        assert np.allclose(got, entropy_bounds(lp, V)[1], rtol=0, atol=1e-12), trial
        f32 = lp.astype(np.float32)  # a record's float32 logprobs: the grouped entropy in float32 arithmetic
        assert np.allclose(entropy_high(f32, grouped_tail_entropy(f32), V), entropy_bounds(f32, V)[1], rtol=0,
                           atol=2e-6), trial


def test_the_kernel_equals_the_papers_formula_as_written():
    """B.4's estimator in plain numpy (grouped_tail_entropy_reference) and the chunked kernel the probes use agree,
    on every case the kernel handles: float32 and float64, NaN and -inf padding, a top-k summing past 1 by
    rounding, a logprob a hair above 0, more rows than one chunk (issue 83)."""
    from analysis.estimators.entropy import grouped_tail_entropy_reference

    rng = np.random.default_rng(7)
    n = 3 * 4096 + 37  # several of the kernel's chunks, and a part of one
    lp = np.log(rng.dirichlet(np.ones(30), n)[:, :20])
    lp[::13, 15:] = np.nan  # a chat server's deduplicated alternatives
    lp[::17, 19] = -np.inf
    lp[5] = np.log(np.full(20, 1 / 19.5))  # sums past 1
    lp[6, 0] = 1e-7  # rounding above 0
    for x, tol in ((lp, 1e-12), (lp.astype(np.float32), 2e-6)):
        np.testing.assert_allclose(grouped_tail_entropy(x), grouped_tail_entropy_reference(x), atol=tol, rtol=0)


def test_a_trajectorys_known_alternatives_are_decoded_once_and_held_compactly():
    """The viewer's alternatives' texts are decoded once per id a trajectory (probes/entropy/step.py KnownIds): a
    step gets the texts of the ids no earlier step carried, and what is remembered is 4 bytes an id."""
    from probes.entropy.step import KnownIds

    known = KnownIds()
    assert known.new(np.array([3, 7, 200_000])).tolist() == [3, 7, 200_000]
    assert known.new(np.array([2, 3, 7, 9])).tolist() == [2, 9]
    assert known.new(np.array([2, 3])).tolist() == []
    assert known.ids.tolist() == [2, 3, 7, 9, 200_000] and known.ids.dtype == np.int32
    rng, seen = np.random.default_rng(0), set(known.ids.tolist())  # steps of a real vocabulary: a set's answers
    for _ in range(30):
        u = np.unique(rng.integers(0, 248_320, 400))
        assert known.new(u).tolist() == sorted(set(u.tolist()) - seen)
        seen |= set(u.tolist())
        assert known.ids.tolist() == sorted(seen)
