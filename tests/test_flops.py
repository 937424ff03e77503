"""The FLOP formula and the peak table."""

import pytest

from ftbench.harness.flops import mfu, peak_tflops, train_flops


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


def test_model_and_hardware_flops_by_hand_with_padding_and_checkpointing():
    from ftbench.harness.flops import step_flops

    shape = {"matmul_params_per_token": 1000, "layers": 2, "attention_width": 8}
    trainable = 10

    def by_hand(t, recompute):
        fwd = 2 * 1000 * t + 4 * 2 * t * t * 8
        bwd = 2 * 1000 * t + 8 * 2 * t * t * 8 + 2 * trainable * t
        return fwd * (2 if recompute else 1) + bwd

    # two sequences of 3 and 5 real tokens padded to 6: the model did 3 + 5 tokens' worth, the GPU 2 x 6
    for checkpointing in (False, True):
        f = step_flops([3, 5], [6, 6], shape, trainable, checkpointing)
        assert f["flops_model"] == by_hand(3, False) + by_hand(5, False)  # never counts recompute or padding
        assert f["flops_hardware"] == 2 * by_hand(6, checkpointing)
    assert step_flops([4], [4], shape, trainable, False)["flops_model"] == step_flops([4], [4], shape, trainable,
                                                                                      False)["flops_hardware"]


def test_a_run_is_scored_against_the_peak_of_the_precision_its_gemms_ran_in():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == peak_tflops("NVIDIA H100 80GB HBM3", "fp16") == 989.4
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1978.9
    assert peak_tflops("NVIDIA H100 80GB HBM3", "fp32") is None  # no TF32 peak in the table: no MFU, not a wrong one
    assert peak_tflops("NVIDIA H100 80GB HBM3", "nf4") is None  # a run records its GEMM dtype (bf16), not nf4
