"""The bigram-hash indices at position 1 (docs/records.md, record #89, bigram-hash embedding).

The record hashes position 1 with x₀ replaced by the reserved row R − 1, and the product
27,191·(R − 1) wraps in int32 before the XOR; the int32 remainder is floor modulo (torch `%`).
`bigram_indices(..., position1="reserved_row")` is checked against a reference written from that
text twice, once with numpy int32 arrays and once with Python ints and an explicit two's-complement
wrap; `position1="token"` (h₁ hashes the real x₀) must differ from it at position 1 only. The
record #89 preset selects "reserved_row", the default config "token".
"""

import numpy as np
import torch

from model.bigram import bigram_indices
from tests.helpers import compose_config

R, N = 754_560, 8_192  # record #89's table rows and sign rows
VOCAB = 50_304
A, B = 36_313, 27_191  # h_t = ((A·x_t) XOR (B·x_{t−1})) mod (R − 1)

HAND = [  # ids 0, 1, 50,256 and 50,303 at positions 0 and 1, one row per pair and then some
    [0, 1, 50_256, 50_303, 7, 7, 0],
    [1, 0, 50_303, 50_256, 1, 2, 3],
    [50_256, 50_303, 0, 1, 50_303, 0, 9],
    [50_303, 50_256, 1, 0, 0, 0, 50_303],
    [0, 0, 0, 0, 0, 0, 0],
]


def wrap32(v: int) -> int:
    """v as a two's-complement int32."""
    return ((v + 2**31) % 2**32) - 2**31


def ref_python(row: list[int], rows: int, signs: int, quirk: bool) -> tuple[list[int], list[int]]:
    """Python ints; each int32 product wrapped explicitly, `%` is floor modulo."""
    m = rows - 1
    h, s = [m], [0]
    for t in range(1, len(row)):
        prev = m if (quirk and t == 1) else row[t - 1]
        h.append((wrap32(A * row[t]) ^ wrap32(B * prev)) % m)
        s.append((row[t - 1] ^ row[t]) % signs)
    return h, s


def ref_numpy(row: list[int], rows: int, signs: int, quirk: bool) -> tuple[list[int], list[int]]:
    """numpy int32 arrays: the products wrap, np.remainder is floor modulo."""
    m = np.int32(rows - 1)
    x = np.asarray(row, dtype=np.int32)
    prev = x[:-1].copy()
    if quirk:
        prev[0] = m
    h = np.remainder(np.bitwise_xor(np.int32(A) * x[1:], np.int32(B) * prev), m)
    s = np.remainder(np.bitwise_xor(x[:-1], x[1:]), np.int32(signs))
    assert h.dtype == np.int32 and s.dtype == np.int32
    return [int(m), *h.tolist()], [0, *s.tolist()]


def random_rows() -> list[list[int]]:
    gen = torch.Generator().manual_seed(89)
    return torch.randint(0, VOCAB, (4, 1_000), generator=gen).tolist()  # 4,000 ids, 4 rows


def assert_matches_reference(rows_: list[list[int]], rows: int, signs: int, position1: str) -> None:
    h, s = bigram_indices(torch.tensor(rows_, dtype=torch.long), rows, signs, position1=position1)
    assert h.dtype == torch.int64 and s.dtype == torch.int64
    assert h.shape == s.shape == (len(rows_), len(rows_[0]))
    for b, row in enumerate(rows_):  # the hash restarts at every row
        want_h, want_s = ref_python(row, rows, signs, quirk=position1 == "reserved_row")
        assert h[b].tolist() == want_h, f"row {b}"
        assert s[b].tolist() == want_s, f"row {b}"


def test_the_two_references_agree_and_the_product_wraps() -> None:
    assert B * (R - 1) == 20_517_213_769 > 2**31 - 1
    assert wrap32(B * (R - 1)) == -957_622_711 < 0  # a reference without the wrap fails here
    assert (np.int32(B) * np.array([R - 1], dtype=np.int32))[0] == -957_622_711
    assert A * (VOCAB - 1) < 2**31 and B * (VOCAB - 1) < 2**31  # t ≥ 2 never overflows
    for rows, signs in [(R, N), (1_000, 16)]:
        for row in [*HAND, *random_rows()]:
            for quirk in (True, False):
                assert ref_numpy(row, rows, signs, quirk) == ref_python(row, rows, signs, quirk)
    # The quirk's h₁ is negative before the floor modulo for x₁ = 0: the sign rule matters.
    h1 = ref_python([5, 0], R, N, quirk=True)[0][1]
    assert h1 == -957_622_711 % (R - 1) == (R - 1) - (957_622_711 % (R - 1))


def test_reserved_row_matches_the_reference() -> None:
    assert_matches_reference(HAND, R, N, "reserved_row")
    assert_matches_reference(random_rows(), R, N, "reserved_row")


def test_token_differs_at_position_1_only() -> None:
    x = torch.tensor(HAND, dtype=torch.long)
    h_tok, s_tok = bigram_indices(x, R, N, position1="token")
    h_res, s_res = bigram_indices(x, R, N, position1="reserved_row")
    for b, row in enumerate(x.tolist()):
        assert h_tok[b, 1].item() == ((A * row[1]) ^ (B * row[0])) % (R - 1)
    assert torch.equal(h_tok[:, 0], h_res[:, 0]) and torch.equal(h_tok[:, 2:], h_res[:, 2:])
    assert torch.equal(s_tok, s_res)
    assert (h_tok[:, 1] != h_res[:, 1]).any()  # the two variants are told apart
    assert_matches_reference(HAND, R, N, "token")
    assert_matches_reference(random_rows(), R, N, "token")


def test_small_table_quirk() -> None:
    rows, signs = 1_000, 16
    # 27,191·999 = 27,163,809 fits int32, so the wrap is the identity for this table.
    assert wrap32(B * (rows - 1)) == B * (rows - 1) == 27_163_809
    assert_matches_reference(HAND, rows, signs, "reserved_row")
    assert_matches_reference(random_rows(), rows, signs, "reserved_row")
    h, _ = bigram_indices(
        torch.tensor(HAND, dtype=torch.long), rows, signs, position1="reserved_row"
    )
    assert h[:, 1].tolist() == [((A * row[1]) ^ 27_163_809) % 999 for row in HAND]


def test_record_preset_selects_the_reserved_row() -> None:
    assert compose_config(["experiment=record_2026_07_17"]).model.bigram.position1 == (
        "reserved_row"
    )
    assert compose_config([]).model.bigram.position1 == "token"
