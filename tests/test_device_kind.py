"""The device kind goldens are kept for: composed from the run (mode, machine, TE layer) and parsed
back from a golden's name in one place, with TE's version a typed part of it (never split out of
the string)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocmport.machine.probe import Environment
from rocmport.verify.orchestration.device_kind import DeviceKind
from rocmport.verify.orchestration.te_layer import PYTHON_LAYER, TELayer

TE = TELayer("2.12.0", Path("/te"), PYTHON_LAYER, "a wheel")
MI300X = Environment(python="3.12", torch="2.13", hip="7.1", cuda=None, device_count=1, devices=["AMD Instinct MI300X"])
A100 = Environment(
    python="3.12", torch="2.13", hip=None, cuda="12.8", device_count=1, devices=["NVIDIA A100-SXM4-80GB"]
)
CPU = Environment(python="3.12", torch="2.13", hip=None, cuda=None, device_count=0)


@pytest.mark.parametrize(
    "mode, machine, te, text",
    [
        ("cpu-proxy", CPU, None, "cpu-proxy"),
        ("cpu-proxy", CPU, TE, "cpu-proxy-te2.12.0"),
        ("gpu", MI300X, None, "rocm-amd-instinct-mi300x"),
        ("gpu", A100, None, "cuda-nvidia-a100-sxm4-80gb"),
    ],
)
def test_a_run_s_kind_is_composed_and_parsed_back_the_same(mode, machine, te, text):
    kind = DeviceKind.of_run(mode, machine, te)
    assert str(kind) == text and DeviceKind.parse(text) == kind
    assert kind.proxy == (mode == "cpu-proxy") and kind.te == (te.version if te else None)


@pytest.mark.parametrize("text", ["", "cpu-proxy-te", "gpu", "rocm-", "metal-m3"])
def test_a_text_that_is_no_kind_is_refused(text):
    with pytest.raises(ValueError, match="not a device kind"):
        DeviceKind.parse(text)


@pytest.mark.parametrize(
    "kind, encoding, text",
    [
        (DeviceKind("cpu-proxy", te="2.17.1"), "fnuz", "cpu-proxy-te2.17.1-fp8-fnuz"),
        (DeviceKind("cpu-proxy", te="2.12.0"), "ocp", "cpu-proxy-te2.12.0-fp8-ocp"),
        (DeviceKind("cpu-proxy", te="2.12.0"), None, "cpu-proxy-te2.12.0"),
        (DeviceKind("rocm", gpu="amd-instinct-mi300x"), "fnuz", "rocm-amd-instinct-mi300x"),
    ],
)
def test_an_fp8_case_s_kind_on_the_proxy_names_its_encoding(kind, encoding, text):
    """One TE version on the proxy casts FNUZ on a simulated gfx942 and OCP on the CUDA control: an FP8
    case's goldens of the two must not share a name (a GPU's name says its encoding already)."""
    fp8_kind = kind.for_fp8(encoding)
    assert str(fp8_kind) == text and DeviceKind.parse(text) == fp8_kind
    assert fp8_kind.te == kind.te and fp8_kind.proxy == kind.proxy


def test_an_fp8_encoding_that_is_none_of_the_proxy_s_is_refused():
    with pytest.raises(ValueError, match="not an FP8 encoding"):
        DeviceKind("cpu-proxy", te="2.17.1").for_fp8("e4m3")
    with pytest.raises(ValueError, match="not a device kind"):
        DeviceKind.parse("cpu-proxy-te-fp8-fnuz")
