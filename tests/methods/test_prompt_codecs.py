"""Pure codecs of the gradient-free prompt method: token-index upload (Alg. 4), analogy download
(Alg. 2, Eqs. 8-11), PCA-n (Eqs. 13-16), Quant-b (Eqs. 17-18) and the Table 1 bit accounting."""

import math

import pytest
import torch

from fedpeft.comm.prompt_compression import (
    analogy_compress,
    analogy_reconstruct,
    dequantize,
    download_bits,
    pca_basis,
    pca_compress,
    pca_reconstruct,
    quantize,
)
from fedpeft.comm.token_index import decode_tokens, encode_tokens, index_dtype


def nbits(*tensors):
    return sum(t.numel() * t.element_size() * 8 for t in tensors)


def embeddings(vocab, dim, seed=0):
    """Random rows of norm ~1: near-orthogonal when vocab is small against dim."""
    return torch.randn(vocab, dim, generator=torch.Generator().manual_seed(seed)) / math.sqrt(dim)


# ---- token-index upload (Alg. 4) ----


def test_upload_is_t_uint16_with_sentinel_and_decodes_bit_for_bit():
    T, V = 50, 1000
    table = embeddings(V, 16)
    base = torch.randn(T, 16, generator=torch.Generator().manual_seed(1))  # rows that are not tokens
    changed = torch.zeros(T, dtype=torch.bool)
    changed[[0, 3, 7, 49]] = True
    tokens = torch.full((T,), -1)
    tokens[changed] = torch.tensor([5, 999, 0, 5])
    client = base.clone()
    client[changed] = table[tokens[changed]]

    up = encode_tokens(tokens, changed, V)
    assert up.dtype == torch.uint16 and up.shape == (T,) and nbits(up) == 800
    assert (up.to(torch.int64)[~changed] == V).all()
    assert torch.equal(up.to(torch.int64)[changed], tokens[changed])
    assert torch.equal(decode_tokens(up, base, table), client)


def test_wide_vocab_uses_int32_and_bad_ids_raise():
    assert index_dtype(65535) == torch.uint16 and index_dtype(65536) == torch.int32
    edge = encode_tokens(torch.tensor([65_534, 3]), torch.tensor([True, False]), 65_535)
    assert edge.dtype == torch.uint16 and edge.to(torch.int64).tolist() == [65_534, 65_535]
    up = encode_tokens(torch.tensor([69_999, 3]), torch.tensor([True, False]), 70_000)
    assert up.dtype == torch.int32 and up.tolist() == [69_999, 70_000]
    with pytest.raises(ValueError, match="tokens"):
        encode_tokens(torch.tensor([1000]), torch.tensor([True]), 1000)
    with pytest.raises(ValueError, match="tokens"):
        encode_tokens(torch.tensor([-1]), torch.tensor([True]), 1000)
    table, base = embeddings(10, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="indices"):
        decode_tokens(torch.tensor([11, 0]), base, table)
    with pytest.raises(ValueError, match="indices"):
        decode_tokens(torch.tensor([0, 1, 2]), base, table)


# ---- analogy download (Alg. 2, Eqs. 8-11) ----


def test_analogy_recovers_a_two_token_residual():
    V, D, T = 200, 64, 4
    table = embeddings(V, D)
    pairs = [(3, 150), (17, 42), (199, 0), (88, 89)]
    residual = torch.stack([0.7 * table[u] - 0.4 * table[w] for u, w in pairs])
    base = embeddings(T, D, seed=2)
    for phi in (2, 3):
        ids, coef = analogy_compress(residual, table, phi)
        assert ids.shape == coef.shape == (T, phi) and coef.dtype == torch.float16
        for row, (u, w) in zip(ids.tolist(), pairs):
            assert {u, w} <= set(row) and len(set(row)) == phi
        err = analogy_reconstruct(base, ids, coef, table) - (base + residual)
        assert err.norm() / residual.norm() < 1e-2


def test_analogy_is_nested_and_monotone_in_phi():
    V, D, T = 200, 64, 6
    table = embeddings(V, D)
    residual = 0.3 * torch.randn(T, D, generator=torch.Generator().manual_seed(3))
    base = torch.zeros(T, D)
    prev_ids, prev_err = None, None
    for phi in (1, 2, 3, 5, 8):
        ids, coef = analogy_compress(residual, table, phi)
        err = (analogy_reconstruct(base, ids, coef, table) - residual).norm(dim=1)
        if prev_ids is not None:
            assert all(set(a) <= set(b) for a, b in zip(prev_ids.tolist(), ids.tolist()))
            # exact in float64; the float16 coefficients add at most a rounding-size slack
            assert (err <= prev_err + 2e-3 * residual.norm(dim=1)).all()
        prev_ids, prev_err = ids, err


def test_analogy_reconstruct_is_bitwise_and_uses_the_float16_coefficients():
    V, D, T, phi = 120, 32, 5, 3
    table = embeddings(V, D)
    base = embeddings(T, D, seed=4)
    residual = 0.2 * torch.randn(T, D, generator=torch.Generator().manual_seed(5))
    residual[2] = 0.0
    ids, coef = analogy_compress(residual, table, phi, exclude=[0, 1])
    ids2, coef2 = analogy_compress(residual, table, phi, exclude=[0, 1])
    assert torch.equal(ids, ids2) and torch.equal(coef, coef2)
    assert not ((ids == 0) | (ids == 1)).any()
    # a zero residual row: ids from the fill rule (all correlations 0, so by id), zero coefficients
    assert ids[2].tolist() == [2, 3, 4] and not coef[2].any()
    server = analogy_reconstruct(base, ids, coef, table)
    client = analogy_reconstruct(base.clone(), ids.clone(), coef.clone(), table.clone())
    assert server.dtype == torch.float32 and torch.equal(server, client)
    c = coef.double()
    expected = base.double() + sum(c[:, j : j + 1] * table.double()[ids[:, j]] for j in range(phi))
    assert torch.equal(server, expected.float())


def test_analogy_alpha_zero_and_phi_bounds():
    table = embeddings(50, 16)
    residual = torch.randn(3, 16, generator=torch.Generator().manual_seed(6))
    ids, coef = analogy_compress(residual, table, 5, alpha=0.0)
    assert ids.shape == (3, 5) and torch.isfinite(coef.float()).all()
    with pytest.raises(ValueError, match="phi"):
        analogy_compress(residual, table, 51)


# ---- PCA-n (Eqs. 13-16) ----


def test_pca_reconstructs_inside_the_span_and_at_full_rank():
    V, D, T, n = 100, 32, 6, 8
    table = embeddings(V, D)
    basis = pca_basis(table, n)
    assert basis.shape == (D, n)
    assert torch.allclose(basis.T @ basis, torch.eye(n, dtype=basis.dtype), atol=1e-10)
    assert (basis.gather(0, basis.abs().argmax(0, keepdim=True)) > 0).all()
    inside = (torch.randn(T, n, generator=torch.Generator().manual_seed(7)).double() @ basis.T).float()
    coded = pca_compress(inside, basis)
    assert coded.dtype == torch.float16 and coded.shape == (T, n)
    assert torch.allclose(pca_reconstruct(coded, basis), inside, atol=5e-3)
    full = pca_basis(table, D)
    prompt = embeddings(T, D, seed=8)
    rec = pca_reconstruct(pca_compress(prompt, full), full)
    assert rec.dtype == torch.float32 and (rec - prompt).norm() / prompt.norm() < 1e-3


# ---- Quant-b (Eqs. 17-18) ----


def test_quant_levels_error_bound_packing_and_zero_row():
    T, D, b = 5, 16, 3
    k = 2 ** (b - 1) - 1
    prompt = torch.randn(T, D, generator=torch.Generator().manual_seed(9))
    prompt[1] = 0.0
    packed, beta = quantize(prompt, b)
    assert packed.dtype == torch.uint8 and packed.numel() == math.ceil(T * D * b / 8)
    assert beta.dtype == torch.float16 and beta.shape == (T,)
    out = dequantize(packed, beta, (T, D), b)
    assert out.dtype == torch.float32 and not out[1].any()
    bt = beta.float()[:, None]
    assert torch.unique(torch.round(out / torch.where(bt > 0, bt, 1.0) * k)).numel() <= 2 * k + 1 == 7
    clipped = torch.maximum(torch.minimum(prompt, bt), -bt)
    assert ((out - clipped).abs() <= bt / (2 * k) + 1e-6).all()
    with pytest.raises(ValueError):
        dequantize(packed[:-1], beta, (T, D), b)


def test_quant_uses_all_seven_levels_for_b3():
    row = torch.linspace(-1.0, 1.0, 13)[None]
    packed, beta = quantize(row, 3)
    levels = dequantize(packed, beta, (1, 13), 3).unique()
    assert torch.allclose(levels, torch.tensor([-3.0, -2, -1, 0, 1, 2, 3]) / 3)


# ---- Table 1 accounting ----


def test_table1_bit_counts():
    T, D = 50, 1024
    assert download_bits("token_index_upload", T, D) == 800
    assert download_bits("analogy", T, D, phi=3) == 4_800
    assert download_bits("analogy", T, D, phi=5) == 8_000
    assert download_bits("full", T, D) == 819_200
    assert download_bits("pca", T, D, n=10) == 8_000
    assert download_bits("pca", T, D, n=300) == 240_000
    assert download_bits("quant", T, D, bits=3) == 154_400
    with pytest.raises(ValueError):
        download_bits("analogy", T, D)


def test_encoded_sizes_match_table1():
    T, D = 50, 1024
    table = embeddings(400, D)
    prompt = embeddings(T, D, seed=10)
    up = encode_tokens(torch.arange(T), torch.ones(T, dtype=torch.bool), 400)
    assert nbits(up) == download_bits("token_index_upload", T, D)
    small = embeddings(120, 32)
    residual = 0.1 * torch.randn(T, 32, generator=torch.Generator().manual_seed(11))
    for phi in (3, 5):
        ids, coef = analogy_compress(residual, small, phi)
        assert nbits(ids.to(torch.uint16), coef) == download_bits("analogy", T, D, phi=phi)
    assert nbits(prompt.half()) == download_bits("full", T, D)
    basis = pca_basis(table, 300)
    for n in (10, 300):
        assert nbits(pca_compress(prompt, basis[:, :n])) == download_bits("pca", T, D, n=n)
    assert nbits(*quantize(prompt, 3)) == download_bits("quant", T, D, bits=3)
