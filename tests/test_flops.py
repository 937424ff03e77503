"""The FLOP formula and the peak table."""

import pytest

from ftbench.flops import mfu, peak_tflops, train_flops


def test_train_flops_by_hand():
    n, nt, layers, d, t = 1000, 10, 2, 8, 4
    fwd = 2 * n * t + 4 * layers * t * t * d
    bwd = 2 * n * t + 8 * layers * t * t * d + 2 * nt * t
    assert train_flops([t], n, nt, layers, d) == fwd + bwd
    assert train_flops([t, t], n, nt, layers, d) == 2 * (fwd + bwd)
    assert train_flops([t], n, nt, layers, d, gradient_checkpointing=True) == 2 * fwd + bwd


def test_full_finetune_is_about_six_n_per_token():
    n = 8e9
    per_token = train_flops([1], n, n, 1, 1) / 1
    assert per_token == pytest.approx(6 * n, rel=1e-6)


def test_peak_table_matches_by_longest_name_fragment():
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") == 438.9
    assert peak_tflops("NVIDIA H200", "fp8") == 1978.9
    assert peak_tflops(None) is None and peak_tflops("Some Future GPU") is None


def test_mfu():
    assert mfu(494.7e12, 989.4) == pytest.approx(0.5)
    assert mfu(None, 989.4) is None and mfu(1e12, None) is None
