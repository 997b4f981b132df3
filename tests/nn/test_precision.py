"""bf16 matrix products in the update step: refused without native bf16, fp32 untouched,
fp32 results, gradients that reach fp32 weights, no stale weight casts, and product results
held in bf16 through ReLU and reshapes with the numbers of casting them back and forth."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from rlfleet.errors import ConfigError
from rlfleet.nn import precision
from rlfleet.nn.cnn import NatureCNN
from rlfleet.nn.encoders import ImageEncoder
from rlfleet.nn.precision import PRODUCTS, bf16_support, check_precision, update_precision
from rlfleet.nn.twin import TwinMLP

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


def test_bf16_is_refused_on_a_cuda_device_before_ampere_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[bool] = []

    def supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return including_emulation  # emulated only, as on a device before Ampere

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    with pytest.raises(ConfigError) as err:
        check_precision("bf16", torch.device("cuda"), "trainer.precision")
    message = str(err.value)
    assert message == (
        "trainer.precision: bf16 refused on cuda: cuda has no native bf16 support (needs "
        "compute capability 8.0 or later); use fp32"
    )
    assert asked == [False]  # native support is what counts, not emulation


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
        change = second - first
    assert layer.weight.grad is not None
    assert layer.weight.grad.dtype == torch.float32
    torch.testing.assert_close(layer.weight.grad, torch.full((4, 4), 2.0))
    # A cached bf16 copy of the weight (torch.autocast's default) would repeat `first`.
    torch.testing.assert_close(change, torch.full((2, 4), 4.0), atol=0.1, rtol=0.0)


class _CastBack(TorchFunctionMode):
    """The plain scheme the held results must reproduce: every product in bf16, its result
    converted to fp32 at once."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in PRODUCTS:
            return func(*args, **kwargs)

        def bf16(value: Any) -> Any:
            is_fp32 = isinstance(value, torch.Tensor) and value.dtype == torch.float32
            return value.to(torch.bfloat16) if is_fp32 else value

        out = func(*map(bf16, args), **{k: bf16(v) for k, v in kwargs.items()})
        return out.float()


def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(5, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3)
    )


class _Twin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.twin = TwinMLP(5, (64, 64), (3, 1), "relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.twin(x)
        return torch.cat([first, second], -1)


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cnn = NatureCNN(2, 36, 36, features=32)
        self.head = nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.cnn(x))
        return out


class _Images(nn.Module):
    """uint8 frames through the image encoder (scaling, channels-last, Nature CNN)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = ImageEncoder((2, 36, 36), "nature")
        self.head = nn.Linear(self.encoder.out_features, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


@pytest.mark.parametrize(
    ("build", "shape"),
    [(_mlp, (16, 5)), (_Twin, (16, 5)), (_CNN, (4, 2, 36, 36)), (_Images, (4, 2, 36, 36))],
    ids=["mlp", "twin", "cnn", "uint8-images"],
)
def test_held_results_give_the_numbers_of_casting_every_product_back(
    build: Callable[[], nn.Module], shape: tuple[int, ...]
) -> None:
    """ReLU and reshapes are exact on bf16 values, so holding a product's result in bf16
    through them changes no number: outputs and gradients equal the cast-back scheme's bit
    for bit."""
    torch.manual_seed(0)
    net = build()
    x = torch.randint(0, 256, shape, dtype=torch.uint8) if build is _Images else torch.randn(shape)
    runs = []
    for mode in (_CastBack, precision.Bf16Products):
        net.zero_grad(set_to_none=True)
        with mode():
            out = torch.log_softmax(net(x), -1)
            out.square().mean().backward()
        assert out.dtype == torch.float32
        runs.append(
            (out.detach(), [p.grad.clone() for p in net.parameters() if p.grad is not None])
        )
    (out_a, grads_a), (out_b, grads_b) = runs
    assert torch.equal(out_a, out_b)
    assert len(grads_a) == len(grads_b) == len(list(net.parameters()))
    for a, b in zip(grads_a, grads_b, strict=True):
        assert b.dtype == torch.float32
        assert torch.equal(a, b)


def test_a_held_result_reaches_every_other_operation_in_fp32() -> None:
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with update_precision("bf16"):
        h = torch.relu(layer(x)).reshape(8)
        assert hasattr(h, precision.HELD)  # held in bf16 through ReLU and the reshape
        assert h.dtype == torch.float32  # what any code that asks sees
        for result in (torch.tanh(h), h * 2, torch.cat([h, h])):
            assert result.dtype == torch.float32
            assert not hasattr(result, precision.HELD)


def test_changing_a_held_result_in_place_is_refused_and_fp32_buffers_take_it() -> None:
    layer = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    with update_precision("bf16"), torch.no_grad():
        out = layer(x)
        with pytest.raises(RuntimeError, match=r"precision bf16: add_ would change .* in place"):
            out.add_(1.0)
        buffer = torch.zeros(2, 4)
        buffer.add_(out)  # an fp32 tensor changed in place by a held one: fine
        assert float(torch.relu_(out).min()) >= 0.0  # exact on bf16: allowed in place
    assert buffer.dtype == torch.float32
    assert float(buffer.abs().sum()) > 0


def test_only_the_thread_in_the_update_step_sees_bf16_products() -> None:
    # A collector thread acting meanwhile must keep building fp32 inputs for its fp32 net.
    seen: list[bool] = []
    assert not precision.bf16_products_active()
    with update_precision("bf16"):
        assert precision.bf16_products_active()
        other = threading.Thread(target=lambda: seen.append(precision.bf16_products_active()))
        other.start()
        other.join()
    assert seen == [False]
    assert not precision.bf16_products_active()
