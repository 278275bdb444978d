"""Shared value-learning losses on hand-computed cases, HL-Gauss targets, return-weighted sampling."""

import math

import numpy as np
import pytest
import torch

from offrl.data import ReplayBuffer
from offrl.data.dataset import Dataset
from offrl.data.preprocess import return_weights
from offrl.losses import HLGauss, awr_weights, ensemble_quantile, expectile_loss, huber_loss


def test_expectile_loss():
    diff = torch.tensor([2.0, -1.0])  # target - prediction
    assert expectile_loss(diff, 0.7).item() == pytest.approx((0.7 * 4 + 0.3 * 1) / 2)
    assert expectile_loss(diff, 0.5).item() == pytest.approx(0.5 * (4 + 1) / 2)


def test_awr_weights_and_their_cap():
    w = awr_weights(torch.tensor([0.0, 1.0, 10.0, -1.0]), beta=3.0)
    torch.testing.assert_close(w, torch.tensor([1.0, math.exp(3.0), 100.0, math.exp(-3.0)]))


def test_huber_with_delta_one_over_sigma_squared():
    sigma = 2.0
    delta = 1 / sigma**2  # 0.25
    out = huber_loss(torch.tensor([0.1, -1.0]), delta)
    torch.testing.assert_close(out, torch.tensor([0.5 * 0.01 / 0.25, 1.0 - 0.125]))
    # sigma = 0.1 -> delta = 100: quadratic (a scaled MSE) for all but huge errors
    assert huber_loss(torch.tensor([3.0]), 1 / 0.1**2).item() == pytest.approx(0.5 * 9 / 100)


def test_ensemble_quantile_interpolates_linearly():
    values = torch.tensor([[5.0, 0.0], [1.0, 0.0], [3.0, 0.0], [2.0, 0.0], [4.0, 4.0]])  # [K=5, B=2]
    torch.testing.assert_close(ensemble_quantile(values, 0.25), torch.tensor([2.0, 0.0]))  # position 1 of 0..4
    torch.testing.assert_close(ensemble_quantile(values, 0.1), torch.tensor([1.4, 0.0]))  # between 1 and 2


def test_hl_gauss_probabilities_sum_to_one_and_recover_the_target():
    hl = HLGauss(-10.0, 10.0, bins=101, sigma_ratio=0.75)
    assert hl.sigma == pytest.approx(0.75 * 20 / 101)
    targets = torch.tensor([-3.3, 0.0, 2.71, 9.5])
    probs = hl.target_probs(targets)
    torch.testing.assert_close(probs.sum(-1), torch.ones(4))
    assert (probs >= 0).all()
    mean = (probs * hl.centers).sum(-1)
    torch.testing.assert_close(mean[:3], targets[:3], atol=1e-3, rtol=0)
    # reading out logits = log p gives the scalar back; that is also where the cross-entropy is minimal
    logits = probs.clamp_min(1e-30).log().requires_grad_()
    torch.testing.assert_close(hl.value(logits)[:3], targets[:3], atol=1e-3, rtol=0)
    hl.cross_entropy(logits, targets).sum().backward()
    assert logits.grad.abs().max() < 1e-5
    # most mass lies within about 3 sigma, i.e. on ~6 neighbouring bins
    assert (probs[1] > 0.01).sum() in (5, 6, 7)
    # targets outside the support are clipped to it
    torch.testing.assert_close(hl.target_probs(torch.tensor([50.0])).sum(-1), torch.ones(1))


def episodes_dataset(returns_per_step, lengths):
    rewards = np.concatenate([np.full(n, r, np.float32) for r, n in zip(returns_per_step, lengths)])
    n = len(rewards)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    timeouts = np.zeros(n, np.float32)
    timeouts[np.cumsum(lengths) - 1] = 1
    return Dataset(np.zeros((n, 1), np.float32), np.zeros((n, 1), np.float32), rewards, np.zeros((n, 1), np.float32),
                   np.zeros(n, np.float32), timeouts, starts, {"name": "w"}).validate()


def test_return_weights_by_hand():
    ds = episodes_dataset([0.0, 0.5, 1.0], [2, 2, 1])  # returns 0, 1, 1 -> scaled 0, 1, 1
    w = return_weights(ds, temperature=0.5)
    expected = np.array([1, 1, math.e**2, math.e**2, math.e**2])
    np.testing.assert_allclose(w, expected / expected.sum())


def test_return_weights_scale_by_the_episodes_that_ended():
    """Returns 2, 4 and 0, the last a 1-step piece the data cut short under a 3-step limit: G_hat is scaled by the
    ended episodes' range (2..4), so the piece gets -1 instead of setting the minimum."""
    ds = episodes_dataset([1.0, 2.0, 0.0], [2, 2, 1])
    w = return_weights(ds, temperature=1.0, max_episode_steps=3)
    expected = np.array([1, 1, math.e, math.e, math.e**-1])
    np.testing.assert_allclose(w, expected / expected.sum())
    everything = np.exp(np.array([0.5, 0.5, 1.0, 1.0, 0.0]))  # without the limit: 0..4
    np.testing.assert_allclose(return_weights(ds, temperature=1.0), everything / everything.sum())


def test_weighted_buffer_samples_in_proportion():
    ds = episodes_dataset([0.0, 1.0], [3, 1])
    ds = ds.replace(observations=np.arange(4, dtype=np.float32)[:, None])  # row i observes i
    buffer = ReplayBuffer.from_dataset(ds, seed=0)
    buffer.set_sampling_weights(np.array([0.1, 0.3, 0.0, 0.6]))
    rows = torch.cat([buffer.sample(1000).observations[:, 0] for _ in range(50)]).long()
    frequencies = torch.bincount(rows, minlength=4).double() / len(rows)
    torch.testing.assert_close(frequencies, torch.tensor([0.1, 0.3, 0.0, 0.6], dtype=torch.float64), atol=0.01, rtol=0)
    buffer.set_sampling_weights(None)  # back to uniform
    rows = torch.cat([buffer.sample(1000).observations[:, 0] for _ in range(20)]).long()
    assert torch.bincount(rows, minlength=4).min() > 4000
    with pytest.raises(ValueError):
        buffer.set_sampling_weights(np.array([1.0, -1.0, 0.0, 0.0]))
