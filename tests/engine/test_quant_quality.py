"""``scripts/bench quant --quality``'s log-likelihood, on the tiny model."""

from __future__ import annotations

import torch

from hearth_bench.quant.quality import log_likelihood
from hearth_engine.model.runner import ModelRunner


def test_log_likelihood_is_the_mean_of_each_tokens_log_probability(
    tiny_runner: ModelRunner,
) -> None:
    """Against cold prefills of each prefix (it read a prefill's [V] logits as rows and
    stopped with an IndexError)."""
    ids = [5, 17, 3, 99, 42, 7]
    expected = 0.0
    for i in range(1, len(ids)):
        logits = tiny_runner.prefill(tiny_runner.new_buffer(1, i + 1), ids[:i])
        expected += float(torch.log_softmax(logits.reshape(-1)[-logits.shape[-1] :], -1)[ids[i]])
    expected /= len(ids) - 1
    got = log_likelihood(tiny_runner, ids)
    assert got < 0
    assert abs(got - expected) <= 1e-4 * abs(expected)
