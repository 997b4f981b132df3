"""Independent random streams from one run seed.

A run's seed feeds several generators: the global torch RNG while networks are initialised,
env resets, the algorithm's own generator (exploration, sampling, minibatch order) and the
replay sampler. Two generators of the same kind seeded with the same integer produce the
same numbers, so the run seed is given directly to at most one generator of each kind; every
other one gets :func:`stream_seed` of it, a seed mixed from the run seed and the stream's
name with NumPy's ``SeedSequence``. Without that, DQN's first random actions repeated the
signs of its first-layer initial weights, and the replay sampler drew its indices from the
same stream as the first env's start states.
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np

Stream = Literal[
    "algorithm",
    "replay",
    "reward_signal",
    "imitation",
    "shuffle",
    "critic",
    "exploration",
    "test",
    "evaluation",
]

_STREAM_IDS: Final[dict[Stream, int]] = {
    "algorithm": 1,
    "replay": 2,
    "reward_signal": 3,
    "imitation": 4,
    "shuffle": 5,
    "critic": 6,
    "exploration": 7,
    "test": 8,
    "evaluation": 9,
}
_DOMAIN: Final = 0x5EED5
"""Sets the streams apart from other ``SeedSequence([seed, k])`` uses of the run seed."""


def stream_seed(seed: int, stream: Stream) -> int:
    """A seed in ``[0, 2**63)`` for ``stream`` of the run seeded with ``seed``: the same
    arguments always give the same seed, and different streams give unrelated ones."""
    entropy = [seed % (1 << 64), _DOMAIN, _STREAM_IDS[stream]]
    state = np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0]
    return int(state) >> 1


EPISODE_SEED_SPAN: Final = 2**31
"""Episode seeds from :func:`episode_seed` are below this, so that adding the episodes
already played keeps them 32-bit seeds."""


def episode_seed(seed: int, stream: Literal["test", "evaluation"]) -> int:
    """The first reset seed of the test episodes (``test``: the trainer's test steps;
    ``evaluation``: a final evaluation after training) of the run seeded with ``seed``.

    Drawn from a stream of the seed, so that runs with neighbouring seeds play unrelated
    episodes: a fixed offset such as ``seed + 10_000`` would give runs 0 and 1 nine of the
    same ten start states at every test step, and one lucky or unlucky set of episodes would
    move every seed's score alike.
    """
    return stream_seed(seed, stream) % EPISODE_SEED_SPAN
