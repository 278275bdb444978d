"""BC and TD3+BC losses on hand-computed cases."""

import pytest
import torch

from algos.bc import bc_loss
from algos.td3_bc import actor_loss, critic_target
from offrl.data import Batch


def test_bc_loss_is_mean_squared_error():
    pred = torch.tensor([[0.5, -1.0], [0.0, 2.0]])
    data = torch.tensor([[0.0, 0.0], [1.0, 2.0]])
    # (0.25 + 1 + 1 + 0) / 4
    assert bc_loss(pred, data).item() == pytest.approx(0.5625)


def test_td3_bc_critic_target():
    batch = Batch(observations=torch.zeros(2, 1), actions=torch.zeros(2, 1), rewards=torch.tensor([1.0, 2.0]),
                  next_observations=torch.zeros(2, 1), terminals=torch.tensor([0.0, 1.0]))
    next_q = torch.tensor([[10.0, 5.0], [8.0, 7.0]])  # [critic, batch]
    # row 0: 1 + 0.9 * min(10, 8); row 1 is terminal: 2
    torch.testing.assert_close(critic_target(batch, next_q, gamma=0.9), torch.tensor([1.0 + 0.9 * 8.0, 2.0]))


def test_td3_bc_actor_loss_and_detached_lambda():
    pi = torch.tensor([[0.5], [-0.5]], requires_grad=True)
    data_actions = torch.zeros(2, 1)
    q_pi = 2.0 * pi.squeeze(1) + 1.0  # [2, 0]: mean|Q| = 1 -> lambda = 2.5
    loss, lam = actor_loss(q_pi, pi, data_actions, alpha=2.5)
    assert lam.item() == pytest.approx(2.5)
    assert loss.item() == pytest.approx(-2.5 * 1.0 + 0.25)  # -lambda * mean Q + MSE
    loss.backward()
    # with lambda a constant: d/dpi = -2.5 * 2 / 2 + 2 * pi / 2 = -2.5 + pi
    torch.testing.assert_close(pi.grad, torch.tensor([[-2.0], [-3.0]]))
