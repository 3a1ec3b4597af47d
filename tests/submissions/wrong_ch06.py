"""Known-wrong solutions of Exercises 6 (format of ``wrong.py``)."""
from __future__ import annotations

_TABLE = """
    i = torch.arange({first}, n + {first}, dtype=torch.float64)[:, None]
    j = torch.arange(d, dtype=torch.float64)
    power = {power}
    angle = i / 10000.0 ** power
    P = torch.zeros(n, d, dtype=torch.float64)
    P[:, 0::2] = torch.{even}(angle[:, 0::2])
    P[:, 1::2] = torch.{odd}(angle[:, 1::2])
    return P
    """
_PAIR = "2 * (j // 2) / d"

_ROPE = """
    d = x.shape[-1]
    theta = 10000.0 ** (-{power} / d)
    angle = {sign}positions.to(torch.float64)[:, None] * theta
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = {split}
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return {join}
    """
_HALF = dict(split="x[..., : d // 2], x[..., d // 2:]", join="torch.cat([y1, y2], dim=-1)")
_K2 = "torch.arange(0, d, 2, dtype=torch.float64)"

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "06_positional_information": {
        "sinusoidal: sin and cos swapped": ({"sinusoidal": _TABLE.format(
            first=0, power=_PAIR, even="cos", odd="sin")}, {"check_sinusoidal"}, "swapped"),
        "sinusoidal: exponent k/d": ({"sinusoidal": _TABLE.format(
            first=0, power="(j // 2) / d", even="sin", odd="cos")}, {"check_sinusoidal"}, "k/d"),
        "sinusoidal: exponent uses the column index": ({"sinusoidal": _TABLE.format(
            first=0, power="j / d", even="sin", odd="cos")}, {"check_sinusoidal"}, "column index"),
        "sinusoidal: positions from 1": ({"sinusoidal": _TABLE.format(
            first=1, power=_PAIR, even="sin", odd="cos")}, {"check_sinusoidal"}, "positions start at 1"),
        "sinusoidal: float32": ({"sinusoidal": """
            i = torch.arange(n, dtype=torch.float32)[:, None]
            omega = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
            P = torch.zeros(n, d)
            P[:, 0::2] = torch.sin(i * omega)
            P[:, 1::2] = torch.cos(i * omega)
            return P
            """}, {"check_sinusoidal"}, "float64"),
        "sinusoidal: hard-coded visible table": ({"sinusoidal": """
            i = torch.arange(4, dtype=torch.float64)[:, None]
            omega = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
            P = torch.zeros(4, 8, dtype=torch.float64)
            P[:, 0::2] = torch.sin(i * omega)
            P[:, 1::2] = torch.cos(i * omega)
            return P
            """}, {"check_sinusoidal"}, "wrong shape"),
        "sinusoidal: from the course library": ({"sinusoidal": """
            from transformer_lib.positional import sinusoidal_encoding
            return sinusoidal_encoding(n, d, dtype=torch.float64)
            """}, {"check_sinusoidal"}, "the course library"),
        "rope: interleaved pairs": ({"rope": _ROPE.format(
            power=_K2, sign="", split="x[..., 0::2], x[..., 1::2]",
            join="torch.stack([y1, y2], dim=-1).flatten(-2)")}, {"check_rope"}, "interleaved"),
        "rope: rotation the wrong way": ({"rope": _ROPE.format(power=_K2, sign="-", **_HALF)},
                                         {"check_rope"}, "wrong way"),
        "rope: frequencies with k/d": ({"rope": _ROPE.format(
            power="torch.arange(d // 2, dtype=torch.float64)", sign="", **_HALF)},
            {"check_rope"}, "k/d"),
        "rope: same angle for every row": ({"rope": _ROPE.format(
            power=_K2, sign="", **_HALF).replace("positions.to(torch.float64)[:, None]",
                                                 "positions.to(torch.float64).max()")},
            {"check_rope"}, "differs from rotating"),
        "rope: from the course library": ({"rope": """
            from transformer_lib.positional import apply_rope
            return apply_rope(x, positions)
            """}, {"check_rope"}, "the course library"),
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
            """}, {"check_relative_test"}, "the rotation stops at position #"),
        "relative test: compares q and k at one position": ({"relative_test": """
            g = torch.Generator().manual_seed(0)
            q = torch.randn(6, d, generator=g, dtype=torch.float64)
            p = torch.arange(6) * 50
            a = (encode(q, p) * encode(q, p)).sum(-1)
            b = (encode(q, p + 9) * encode(q, p + 9)).sum(-1)
            return bool(torch.allclose(a, b, atol=1e-8))
            """}, {"check_relative_test"}, "accepts an encoding"),
        "relative test with float positions": ({"relative_test": """
            q = torch.randn(5, d, dtype=torch.float64)
            base = (encode(q, torch.arange(5.0)) * encode(q, torch.arange(5.0))).sum(-1)
            return bool(torch.isfinite(base).all())
            """}, {"check_relative_test"}, "integer positions of shape (n,)"),
    },
}
