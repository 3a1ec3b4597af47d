"""Known-wrong solutions of Exercises 6 (format of ``wrong.py``)."""
from __future__ import annotations

_SLOPES = """
    p = 1
    while 2 * p <= H:
        p *= 2
    first = [2.0 ** (-8.0 * h / p) for h in range(1, p + 1)]
    extra = [2.0 ** (-8.0 * h / (2 * p)) for h in {extra}]
    return torch.tensor(first + extra, dtype=torch.float64)
    """

_COLUMNS = """
    d_k = W.shape[1] // n_heads
    sigma = {sigma}
    return W[:, torch.cat([h * d_k + sigma for h in range(n_heads)])]
    """
_EVENS_ODDS = "torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])"

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "06_positional_information": {
        "slopes: the power-of-two formula for every H": ({"alibi_slopes": """
            return torch.tensor([2.0 ** (-8.0 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
            """}, {"check_alibi_slopes"}, "is the rule for a power of two"),
        "slopes: the first H - p slopes of 2p heads": ({"alibi_slopes": _SLOPES.format(
            extra="range(1, H - p + 1)")}, {"check_alibi_slopes"}, "every other slope of 16 heads"),
        "slopes: every other slope from the second": ({"alibi_slopes": _SLOPES.format(
            extra="range(2, 2 * (H - p) + 1, 2)")}, {"check_alibi_slopes"}, "repeat slopes of 8 heads"),
        "slopes: the first H slopes of the next power of two": ({"alibi_slopes": """
            p = 1
            while p < H:
                p *= 2
            return torch.tensor([2.0 ** (-8.0 * h / p) for h in range(1, H + 1)], dtype=torch.float64)
            """}, {"check_alibi_slopes"}, "these are the first 12 slopes of 16 heads"),
        "slopes: sorted from the largest": ({"alibi_slopes": _SLOPES.format(extra="range(1, 2 * (H - p), 2)")
                                            .replace("return torch.tensor(first + extra, dtype=torch.float64)",
                                                     "return torch.tensor(sorted(first + extra, reverse=True), "
                                                     "dtype=torch.float64)")},
                                            {"check_alibi_slopes"}, "keep BLOOM's order"),
        "slopes: h from 0": ({"alibi_slopes": """
            return torch.tensor([2.0 ** (-8.0 * h / H) for h in range(H)], dtype=torch.float64)
            """}, {"check_alibi_slopes"}, "h runs from 1 to H"),
        "slopes: float32": ({"alibi_slopes": _SLOPES.format(extra="range(1, 2 * (H - p), 2)").replace(
            "torch.float64", "torch.float32")}, {"check_alibi_slopes"}, "float64"),
        "slopes: the visible answers looked up": ({"alibi_slopes": """
            eight = [2.0 ** (-h) for h in range(1, 9)]
            table = {8: eight, 12: eight + [2.0 ** (-h / 2) for h in (1, 3, 5, 7)]}
            rule = [2.0 ** (-8.0 * h / H) for h in range(1, H + 1)]
            return torch.tensor(table[H] if H in table else rule, dtype=torch.float64)
            """}, {"check_alibi_slopes"}, "is the rule for a power of two"),
        "slopes: from the course library": ({"alibi_slopes": """
            from transformer_lib.positional import alibi_slopes as library_slopes
            return library_slopes(H, torch.float64)
            """}, {"check_alibi_slopes"}, "the course library"),
        "permutation: sigma over all the columns at once": ({"rope_permutation": """
            n = W.shape[1]
            return W[:, torch.cat([torch.arange(0, n, 2), torch.arange(1, n, 2)])]
            """}, {"check_rope_permutation"}, "σ acts inside each head"),
        "permutation: the inverse of sigma": ({"rope_permutation": _COLUMNS.format(
            sigma=f"torch.argsort({_EVENS_ODDS})")}, {"check_rope_permutation"}, "the way back"),
        "permutation: the odd coordinates first": ({"rope_permutation": _COLUMNS.format(
            sigma="torch.cat([torch.arange(1, d_k, 2), torch.arange(0, d_k, 2)])")},
            {"check_rope_permutation"}, "the even coordinates come first"),
        "permutation: W returned unchanged": ({"rope_permutation": """
            return W.clone()
            """}, {"check_rope_permutation"}, "W is unchanged"),
        "permutation: the rows reordered when W is square": ({"rope_permutation": _COLUMNS.format(
            sigma=_EVENS_ODDS).replace("return W[:, torch.cat([h * d_k + sigma for h in range(n_heads)])]",
                                       "order = torch.cat([h * d_k + sigma for h in range(n_heads)])\n    "
                                       "return W[order] if W.shape[0] == W.shape[1] else W[:, order]")},
            {"check_rope_permutation"}, "not its rows"),
        "relative test: always true": ({"relative_test": """
            return True
            """}, {"check_relative_test"}, "accepts an encoding"),
        "relative test: exact comparison": ({"relative_test": """
            g = torch.Generator().manual_seed(0)
            q = torch.randn(5, d, generator=g, dtype=torch.float64)
            k = torch.randn(5, d, generator=g, dtype=torch.float64)
            m, n = torch.arange(5) * 37, torch.arange(5) * 11
            base = (encode(q, m) * encode(k, n)).sum(-1)
            return bool(torch.equal((encode(q, m + 3) * encode(k, n + 3)).sum(-1), base))
            """}, {"check_relative_test"}, "rejects a relative encoding"),
        "relative test: small positions only": ({"relative_test": """
            g = torch.Generator().manual_seed(0)
            q = torch.randn(4, d, generator=g, dtype=torch.float64)
            k = torch.randn(4, d, generator=g, dtype=torch.float64)
            m, n = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
            base = (encode(q, m) * encode(k, n)).sum(-1)
            shifted = (encode(q, m + 1) * encode(k, n + 1)).sum(-1)
            return bool(torch.allclose(shifted, base, atol=1e-8))
            """}, {"check_relative_test"}, "the rotation stops at position 100"),
        "relative test: compares q and k at one position": ({"relative_test": """
            g = torch.Generator().manual_seed(0)
            q = torch.randn(6, d, generator=g, dtype=torch.float64)
            p = torch.arange(6) * 50
            a = (encode(q, p) * encode(q, p)).sum(-1)
            b = (encode(q, p + 9) * encode(q, p + 9)).sum(-1)
            return bool(torch.allclose(a, b, atol=1e-8))
            """}, {"check_relative_test"}, "accepts an encoding"),
        "relative test: a sample of position pairs": ({"relative_test": """
            g = torch.Generator().manual_seed(0)
            q = torch.randn(6, d, generator=g, dtype=torch.float64)
            k = torch.randn(6, d, generator=g, dtype=torch.float64)
            m, n = torch.randint(0, 400, (6,), generator=g), torch.randint(0, 400, (6,), generator=g)
            base = (encode(q, m) * encode(k, n)).sum(-1)
            return all(torch.allclose((encode(q, m + c) * encode(k, n + c)).sum(-1), base, atol=1e-8)
                       for c in (1, 37, 111))
            """}, {"check_relative_test"}, "changed at one position"),
        "relative test: positions beyond the table": ({"relative_test": """
            q = torch.randn(3, d, dtype=torch.float64)
            m = torch.tensor([0, 300, 600])
            return bool(torch.allclose((encode(q, m) * encode(q, m + 5)).sum(-1),
                                       (encode(q, m + 1) * encode(q, m + 6)).sum(-1), atol=1e-8))
            """}, {"check_relative_test"}, "positions from 0 to 511"),
        "relative test with float positions": ({"relative_test": """
            q = torch.randn(5, d, dtype=torch.float64)
            base = (encode(q, torch.arange(5.0)) * encode(q, torch.arange(5.0))).sum(-1)
            return bool(torch.isfinite(base).all())
            """}, {"check_relative_test"}, "integer positions of shape (n,)"),
    },
}
