"""Rollout minibatches: every step exactly once per epoch, shuffled anew each epoch, recurrent
sequences replayed from their stored states, masks and weights riding along."""

from __future__ import annotations

import numpy as np
import torch

from rlfleet.data.minibatches import (
    SequenceMinibatches,
    StepMinibatches,
    rollout_minibatches,
)
from rlfleet.data.rollout import RolloutStorage
from rlfleet.types import Minibatch, PolicyStep

STEPS, ENVS = 8, 3


def _rollout(
    state_shape: tuple[int, ...] | None = None, invalid: tuple[tuple[int, int], ...] = ()
) -> RolloutStorage:
    """Step ``t`` of env ``e`` has id ``t * ENVS + e`` in its observation, action, value and
    advantage (and every entry of its recurrent state); its mask is true at ``id % 4``."""
    storage = RolloutStorage(STEPS, ENVS, (2,), (), state_shape=state_shape)
    for t in range(STEPS):
        ids = torch.arange(ENVS, dtype=torch.float32) + t * ENVS
        valid = np.ones(ENVS, np.float32)
        for step, env in invalid:
            if step == t:
                valid[env] = 0.0
        mask = torch.nn.functional.one_hot(ids.long() % 4, 4).bool()
        state = (
            None
            if state_shape is None
            else ids.reshape(ENVS, *(1 for _ in state_shape)).expand(ENVS, *state_shape)
        )
        storage.insert(
            t,
            ids.reshape(ENVS, 1).expand(ENVS, 2),
            PolicyStep(actions=ids, log_probs=-ids, values=ids),
            np.zeros(ENVS),
            np.zeros(ENVS),
            np.zeros(ENVS),
            valid,
            mask=mask,
            state=state,
        )
    storage.set_length(STEPS)  # as a collector does when its rollout is complete
    return storage


def _ids(minibatch: Minibatch) -> list[int]:
    return [int(a) for a in minibatch.actions.reshape(-1)]


def _check_rows_belong_together(minibatch: Minibatch) -> None:
    ids = minibatch.actions.reshape(-1)
    torch.testing.assert_close(minibatch.obs.reshape(-1, 2)[:, 0], ids)
    torch.testing.assert_close(minibatch.old_values, ids)
    torch.testing.assert_close(minibatch.old_log_probs, -ids)
    torch.testing.assert_close(minibatch.advantages, ids * 10)
    torch.testing.assert_close(minibatch.returns, ids * 100)
    assert minibatch.masks is not None
    expected_masks = torch.nn.functional.one_hot(ids.long() % 4, 4).bool()
    assert torch.equal(minibatch.masks.reshape(-1, 4), expected_masks)


def _targets(storage: RolloutStorage) -> tuple[torch.Tensor, torch.Tensor]:
    return storage.values * 10, storage.values * 100


def test_steps_cover_the_rollout_exactly_once_per_epoch_in_a_new_order() -> None:
    storage = _rollout()
    advantages, returns = _targets(storage)
    minibatches = rollout_minibatches(
        storage, advantages, returns, 5, torch.Generator().manual_seed(0)
    )
    assert isinstance(minibatches, StepMinibatches)
    orders = []
    for _ in range(2):
        epoch = list(minibatches.epoch())
        assert [len(mb.actions) for mb in epoch] == [5, 5, 5, 5, 4]
        for mb in epoch:
            _check_rows_belong_together(mb)
        order = [i for mb in epoch for i in _ids(mb)]
        assert sorted(order) == list(range(STEPS * ENVS))
        orders.append(order)
    assert orders[0] != orders[1]
    assert orders[0] != sorted(orders[0])


def test_one_minibatch_holding_the_whole_rollout_keeps_storage_order() -> None:
    storage = _rollout()
    advantages, returns = _targets(storage)
    generator = torch.Generator().manual_seed(0)
    state = generator.get_state()
    (only,) = rollout_minibatches(storage, advantages, returns, 64, generator).epoch()
    assert _ids(only) == list(range(STEPS * ENVS))
    _check_rows_belong_together(only)
    assert torch.equal(generator.get_state(), state)  # no random draw at all


def test_weights_are_the_valid_mask_over_its_sum_in_each_minibatch() -> None:
    storage = _rollout(invalid=((2, 0), (5, 1), (5, 2)))
    advantages, returns = _targets(storage)
    invalid_ids = {2 * ENVS + 0, 5 * ENVS + 1, 5 * ENVS + 2}
    minibatches = rollout_minibatches(
        storage, advantages, returns, 6, torch.Generator().manual_seed(1)
    )
    for mb in minibatches.epoch():
        valid = torch.tensor([float(i not in invalid_ids) for i in _ids(mb)])
        torch.testing.assert_close(mb.weights, valid / valid.sum().clamp(min=1.0))
        assert float(mb.weights.sum()) == (1.0 if valid.sum() > 0 else 0.0)


def test_sequences_start_at_their_stored_states_and_cover_every_step_once() -> None:
    storage = _rollout(state_shape=(2, 3), invalid=((3, 1),))
    advantages, returns = _targets(storage)
    minibatches = rollout_minibatches(
        storage, advantages, returns, 8, torch.Generator().manual_seed(0), sequence_length=4
    )
    assert isinstance(minibatches, SequenceMinibatches)
    assert minibatches.num_sequences == (STEPS // 4) * ENVS
    seen: list[int] = []
    for mb in minibatches.epoch():
        assert mb.obs.shape[:2] == (4, 2)  # [L, sequences]: 8 steps // 4 = 2 sequences
        assert mb.states is not None
        assert mb.starts is not None
        _check_rows_belong_together(mb)
        ids = mb.obs[..., 0]  # [L, sequences]
        for column in range(ids.shape[1]):
            sequence = [int(i) for i in ids[:, column]]
            first_step, env = divmod(sequence[0], ENVS)
            # Consecutive steps of one env, starting at a chunk boundary.
            assert sequence == [(first_step + k) * ENVS + env for k in range(4)]
            assert first_step % 4 == 0
            # Replayed from the state stored at the sequence's first step.
            assert torch.equal(mb.states[column], torch.full((2, 3), float(sequence[0])))
            # A step after an invalid (reset) step starts an episode.
            expected_starts = [float((first_step + k - 1, env) == (3, 1)) for k in range(4)]
            assert mb.starts[:, column].tolist() == expected_starts
        seen += [int(i) for i in ids.reshape(-1)]
    assert sorted(seen) == list(range(STEPS * ENVS))


def test_a_sequence_length_that_does_not_divide_gives_one_sequence_per_env() -> None:
    storage = _rollout(state_shape=(1,))
    advantages, returns = _targets(storage)
    minibatches = rollout_minibatches(
        storage, advantages, returns, 100, torch.Generator().manual_seed(0), sequence_length=3
    )
    assert isinstance(minibatches, SequenceMinibatches)
    (only,) = minibatches.epoch()
    assert only.obs.shape[:2] == (STEPS, ENVS)
    assert only.states is not None
    assert sorted(int(s) for s in only.states.reshape(-1)) == list(range(ENVS))
