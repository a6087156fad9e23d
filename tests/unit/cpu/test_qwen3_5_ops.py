"""Qwen3.5's sgl-kernel CPU ops (sglang_radixflow.cpu.qwen3_5) against plain references.

References follow the model's own non-fused code path (`forward_prepare_native`, `fix_query_key_value_ordering`)
in float64, one head at a time, so they share no code with the implementations under test.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from sglang_radixflow.cpu.qwen3_5 import ops
from tests.unit.cpu.fresh import failure_text, run_in_cpu_engine

F64 = torch.float64


def ref_gemma_norm_per_head(x: torch.Tensor, weight: torch.Tensor, eps: float, head_dim: int) -> torch.Tensor:
    """[T, H*D] -> [T, H*D]: each head's D values scaled by 1 / rms and by (1 + weight)."""
    rows = []
    for t in range(x.shape[0]):
        heads = []
        for h in range(x.shape[1] // head_dim):
            v = x[t, h * head_dim:(h + 1) * head_dim].to(F64)
            heads.append(v / torch.sqrt((v * v).mean() + eps) * (1 + weight.to(F64)))
        rows.append(torch.cat(heads))
    return torch.stack(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_qk_gemma_rmsnorm_normalises_each_head(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    T, Hq, Hk, D = 5, 4, 2, 32
    qkv = torch.randn(T, (Hq + 2 * Hk) * D).to(dtype)
    q, k = qkv[:, : Hq * D], qkv[:, Hq * D:(Hq + Hk) * D]  # strided slices, as the model passes them
    qw, kw = torch.randn(D).to(dtype) * 0.1, torch.randn(D).to(dtype) * 0.1
    q_by_head, k_by_head = ops.fused_qk_gemma_rmsnorm_cpu(q, k, qw, kw, 1e-6, D)
    assert q_by_head.shape == (T * Hq, D) and k_by_head.shape == (T * Hk, D) and q_by_head.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(q_by_head.view(T, -1).to(F64), ref_gemma_norm_per_head(q, qw, 1e-6, D), **tol)
    torch.testing.assert_close(k_by_head.view(T, -1).to(F64), ref_gemma_norm_per_head(k, kw, 1e-6, D), **tol)


def test_fused_qk_gemma_rmsnorm_with_gate_splits_each_head_into_query_and_gate() -> None:
    """q_gate holds per head [q_h | gate_h] (forward_prepare_native: view(T, H, 2D).chunk(2)); q and k come back
    normed, the gate untouched."""
    torch.manual_seed(1)
    T, Hq, Hk, D = 3, 4, 2, 16
    q_gate, k = torch.randn(T, Hq * 2 * D), torch.randn(T, Hk * D)
    qw, kw = torch.randn(D) * 0.1, torch.randn(D) * 0.1
    q, gate = (x.reshape(T, -1) for x in torch.chunk(q_gate.view(T, Hq, 2 * D), 2, dim=-1))
    q_out, k_out, gate_out = ops.fused_qk_gemma_rmsnorm_with_gate_cpu(q_gate, k, qw, kw, 1e-6, D, Hq)
    assert q_out.shape == (T, Hq * D) and k_out.shape == (T, Hk * D) and gate_out.shape == (T, Hq * D)
    torch.testing.assert_close(q_out.to(F64), ref_gemma_norm_per_head(q, qw, 1e-6, D))
    torch.testing.assert_close(k_out.to(F64), ref_gemma_norm_per_head(k, kw, 1e-6, D))
    assert torch.equal(gate_out, gate)


def test_fused_sigmoid_mul_scales_in_place_by_the_sigmoid_of_a_strided_gate() -> None:
    torch.manual_seed(2)
    T, H, D = 4, 3, 8
    x = torch.randn(T, H * D)
    gate_3d = torch.randn(T, H, 2 * D)[..., D:]  # the strided per-head view the model passes
    expected = x.to(F64) * torch.sigmoid(gate_3d.reshape(T, -1).to(F64))
    before = x.data_ptr()
    assert ops.fused_sigmoid_mul_cpu(x, gate_3d) is None
    assert x.data_ptr() == before
    torch.testing.assert_close(x.to(F64), expected)


def test_contiguous_qkvzba_split_matches_the_models_own_split() -> None:
    """Qwen3.5 projects to [all_q | all_k | all_v | all_z] and [all_b | all_a] (fix_query_key_value_ordering):
    mixed_qkv is q|k|v, z is [T, HV, V], b and a one value per value head."""
    torch.manual_seed(3)
    T, H, HV, K, V = 6, 2, 4, 8, 12
    qkvz, ba = torch.randn(T, 2 * H * K + 2 * HV * V), torch.randn(T, 2 * HV)
    query, key, value, z_ref = qkvz.split([H * K, H * K, HV * V, HV * V], dim=-1)
    mixed_qkv, z, b, a = ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, H, HV, K, V)
    assert torch.equal(mixed_qkv, torch.cat([query, key, value], dim=-1))
    assert torch.equal(z, z_ref.reshape(T, HV, V))
    assert torch.equal(b, ba[:, :HV]) and torch.equal(a, ba[:, HV:])
    assert all(t.is_contiguous() for t in (mixed_qkv, z, b, a))
    with pytest.raises(AssertionError):
        ops.fused_qkvzba_split_reshape_cat_contiguous_cpu(qkvz, ba, H, HV + 1, K, V)  # layout mismatch is loud


def test_qwen3_5_module_imports_on_the_cpu_engine_and_binds_these_ops() -> None:
    """SGLang's qwen3_5.py reads four torch.ops.sgl_kernel ops in its module body on a CPU: in a fresh interpreter
    they are registered before that body runs, and afterwards the module's globals are our Python functions."""
    code = textwrap.dedent(
        """
        import torch
        from sglang_radixflow.cpu import boot
        from sglang_radixflow.cpu.qwen3_5 import ops
        import sglang.srt.models.qwen3_5_text as text
        import sglang.srt.models.qwen3_5 as m
        assert boot.standin_active(), boot.status()
        assert m._fused_sigmoid_mul_cpu is ops.fused_sigmoid_mul_cpu
        assert m.fused_qk_gemma_rmsnorm is ops.fused_qk_gemma_rmsnorm_cpu
        assert m.fused_qk_gemma_rmsnorm_with_gate is ops.fused_qk_gemma_rmsnorm_with_gate_cpu
        assert m.fused_qkvzba_split_reshape_cat_contiguous is ops.fused_qkvzba_split_reshape_cat_contiguous_cpu
        assert hasattr(torch.ops.sgl_kernel, "fused_sigmoid_mul_cpu")
        assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # must not switch SGLang to AMX paths
        patched = [p for p in boot.status()["patched"] if p.startswith("sglang.srt.models.qwen3_5 ")]
        assert patched[0].endswith("(before import)"), patched
        x, gate = torch.ones(2, 4), torch.zeros(2, 4)
        assert torch.equal(m.fused_sigmoid_mul(x, gate, inplace=False), torch.full((2, 4), 0.5))
        print("BOUND", text.Qwen3_5ForCausalLM.__name__)
        """
    )
    proc = run_in_cpu_engine(code)
    assert proc.returncode == 0 and "BOUND Qwen3_5ForCausalLM" in proc.stdout, failure_text(proc)
