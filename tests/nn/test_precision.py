"""bf16 matrix products in the update step: refused without native bf16, fp32 untouched,
fp32 results, gradients that reach fp32 weights, and no stale weight casts."""

from __future__ import annotations

import pytest
import torch

from rlfleet.errors import ConfigError
from rlfleet.nn import precision
from rlfleet.nn.precision import bf16_support, check_precision, update_precision

CPU = torch.device("cpu")
ROUNDED_AWAY = 1 + 2**-10
"""Exact in fp32, rounded to 1.0 in bf16 (8 bits of mantissa)."""


def _product() -> float:
    return float(torch.full((1, 1), ROUNDED_AWAY) @ torch.ones(1, 1))


def test_fp32_is_accepted_everywhere_and_changes_nothing() -> None:
    check_precision("fp32", CPU, "trainer.precision")
    check_precision("fp32", torch.device("meta"), "trainer.precision")
    with update_precision("fp32"):
        assert _product() == ROUNDED_AWAY


def test_bf16_is_refused_on_a_cpu_without_bf16_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    with pytest.raises(ConfigError) as err:
        check_precision("bf16", CPU, "trainer.precision")
    message = str(err.value)
    assert message.startswith("trainer.precision: bf16 refused on cpu: ")
    assert "AVX-512 BF16 or AMX" in message
    assert message.endswith("use fp32")
    assert "\n" not in message


def test_bf16_is_refused_on_devices_rlfleet_offers_it_not_on() -> None:
    reason = bf16_support(torch.device("meta"))
    assert reason is not None
    assert "cpu and cuda" in reason


def test_a_value_that_is_no_precision_names_what_is_expected() -> None:
    with pytest.raises(ConfigError, match=r"expected 'fp32' or 'bf16', got 'fp16'"):
        check_precision("fp16", CPU, "trainer.precision")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "product",
    [
        lambda a, b: a @ b,
        torch.matmul,
        torch.mm,
        lambda a, b: torch.nn.functional.linear(a, b.T),
        lambda a, b: torch.bmm(a[None], b[None])[0],
        lambda a, b: torch.addmm(torch.zeros(1, 1), a, b),
        lambda a, b: torch.baddbmm(torch.zeros(1, 1, 1), a[None], b[None])[0],
    ],
)
def test_bf16_rounds_the_inputs_of_every_product_and_returns_fp32(product: object) -> None:
    a, b = torch.full((1, 1), ROUNDED_AWAY), torch.ones(1, 1)
    with update_precision("bf16"):
        out = product(a, b)  # type: ignore[operator]
        assert out.dtype == torch.float32
        assert float(out) == 1.0
        # Everything that is not a product stays fp32.
        assert float(a * b) == ROUNDED_AWAY
        assert torch.log_softmax(torch.zeros(1, 3), -1).dtype == torch.float32
    assert _product() == ROUNDED_AWAY


def test_bf16_gradients_reach_fp32_weights_and_see_every_weight_update() -> None:
    layer = torch.nn.Linear(4, 4)
    x = torch.ones(2, 4)
    with update_precision("bf16"):
        first = layer(x)
        first.sum().backward()
        with torch.no_grad():
            layer.weight.add_(1.0)  # an optimiser step inside the same update step
        second = layer(x)
    assert layer.weight.grad is not None
    assert layer.weight.grad.dtype == torch.float32
    torch.testing.assert_close(layer.weight.grad, torch.full((4, 4), 2.0))
    # A cached bf16 copy of the weight (torch.autocast's default) would repeat `first`.
    torch.testing.assert_close(second - first, torch.full((2, 4), 4.0), atol=0.1, rtol=0.0)
