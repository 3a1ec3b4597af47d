"""Submissions that get past a reading of the source that is not what IPython runs, that lists the
refused names by hand, that lets the notebook change the libraries, or that takes cell roles from the
student's metadata (each earned full marks on the exercise it attacks before the grader closed its class).

``ATTACKS[stem][name] = (edit, attacked, marker)``: ``edit`` is either solution regions to replace (as in
``attacks.py``) or a function from the instructor notebook to the submission; graded through the command
line in the sandbox (tests/grading/test_grading_notebooks.py), the submission must score 0 on the checks
``attacked`` and its honest points elsewhere, and the class report must list its refused line, the
first line of the submission that contains ``marker``. The runtime escapes inside them (the profile
watch switched off, torch's function modes disabled) are the ones a student used: the grader's reading
must refuse them before they run.
"""
from __future__ import annotations

import copy

import nbformat

from transformer_lib.grading.prepare.notebook import grade_id

# The banned call, with the watches switched off around it (what the attacks below smuggle past the reading).
# A change to a library class outlives its cell: it costs its exercise and every one after it.
FROM_2_2 = {"check_stable_softmax", "check_attention", "check_masked_attention", "check_score_std", "check_score_range",
            "check_variance_divided_by_dk", "check_permuted_mask"}
ESCAPE = ("import sys, torch\\nsys.setprofile(None)\\nwith torch._C.DisableTorchFunction():\\n"
          "    out = torch.softmax(x, dim)")


def _cell(nb, gid: str):
    return next(c for c in nb.cells if grade_id(c) == gid)


def _with_source(gid: str, source: str):
    def build(nb):
        nb = copy.deepcopy(nb)
        _cell(nb, gid).source = source
        return nb
    return build


def _copied_id(nb):
    """The setup cell carries the id of 2.5's solution cell: with exercises assigned by ids, every cell
    after it was 2.5's, and the refusals in 2.2's cell cost 2.5 (1 point) instead of 2.2 (2 points)."""
    nb = copy.deepcopy(nb)
    nb.cells[1]["id"] = _cell(nb, "permuted_mask")["id"]
    _cell(nb, "stable_softmax").source = STABLE_ESCAPE
    return nb


def _copied_grade_id(nb):
    """The same with 2.5's grade_id in the setup cell's metadata (a variant)."""
    nb = copy.deepcopy(nb)
    nb.cells[1].metadata["nbgrader"] = {"grade_id": "permuted_mask", "solution": True, "grade": False,
                                        "locked": False, "schema_version": 3}
    _cell(nb, "stable_softmax").source = STABLE_ESCAPE
    return nb


def _new_check_cell(nb):
    """A cell marked ``grade: true`` with a grade_id of its own, before 2.2's solution: taken for a check
    cell, it was neither read nor watched. Its code makes the function that 2.2's cell only wraps."""
    nb = copy.deepcopy(nb)
    index = nb.cells.index(_cell(nb, "stable_softmax"))
    fake = nbformat.v4.new_code_cell(
        "global impl\nimport sys\n\ndef impl(x, dim):\n    sys.setprofile(None)\n"
        "    with torch._C.DisableTorchFunction():\n        return torch.softmax(x, dim)\n")
    fake.metadata["nbgrader"] = {"grade": True, "grade_id": "my_own_check", "points": 1, "locked": True,
                                 "schema_version": 3, "solution": False}
    nb.cells.insert(index, fake)
    _cell(nb, "stable_softmax").source = "def stable_softmax(x, dim=-1):\n    return impl(x, dim)\n"
    return nb


STABLE_ESCAPE = ("import sys\n\ndef stable_softmax(x, dim=-1):\n    sys.setprofile(None)\n"
                 "    with torch._C.DisableTorchFunction():\n        return torch.softmax(x, dim)\n")
SOFTMAX_BY_ATTRIBUTE = {  # the interpreter reached as an attribute, under the names a module gives it
    "exec reached through torch.sys": f"""
        scope = {{"x": x, "dim": dim}}
        torch.sys.modules["builtins"].exec("{ESCAPE}", scope)
        return scope["out"]
        """,
    "builtins reached through enum.bltns": f"""
        import enum
        scope = {{"x": x, "dim": dim}}
        run = enum.bltns.exec
        run("{ESCAPE}", scope)
        return scope["out"]
        """,
    "watch switched off through torch's public alias": """
        with torch.DisableTorchFunction():
            return torch.exp(x - x.amax(dim=dim, keepdim=True)) / torch.exp(x - x.amax(dim=dim, keepdim=True)).sum(
                dim=dim, keepdim=True)
        """,
}

ATTACKS: dict[str, dict[str, tuple[object, set[str], str]]] = {
    "02_building_up_attention": {
        **{name: ({"stable_softmax": body}, {"check_stable_softmax"}, marker) for (name, body), marker in zip(
            SOFTMAX_BY_ATTRIBUTE.items(), ("torch.sys", "enum.bltns", "torch.DisableTorchFunction"))},
        "an IPython-only line hides the cell": (_with_source("stable_softmax", "/print 1\n" + STABLE_ESCAPE),
                                                {"check_stable_softmax"}, "import sys"),
        "%timeit with options hides its statement": (_with_source("stable_softmax", (
            "%timeit -n1 -r1 global impl; import sys, torch; impl = lambda x, dim: [sys.setprofile(None), "
            "torch._C.DisableTorchFunction().__enter__(), torch.softmax(x, dim)][-1]\n"
            "def stable_softmax(x, dim=-1):\n    return impl(x, dim)\n")), {"check_stable_softmax"}, "%timeit"),
        "%%timeit with a setup statement": (_with_source("stable_softmax", (
            "%%timeit -n1 -r1 global impl; import sys, torch; impl = lambda x, dim: [sys.setprofile(None), "
            "torch._C.DisableTorchFunction().__enter__(), torch.softmax(x, dim)][-1]\n"
            "global stable_softmax\ndef stable_softmax(x, dim=-1):\n    return impl(x, dim)\n")),
            {"check_stable_softmax"}, "%%timeit"),
        "a copied cell id moves the cost": (_copied_id, {"check_stable_softmax"}, "import sys"),
        "a copied grade_id moves the cost": (_copied_grade_id, {"check_stable_softmax"}, "import sys"),
        "a check cell of the student's own": (_new_check_cell, {"check_stable_softmax"}, "import sys"),
        "torch.Tensor.detach rebound": ({"stable_softmax": """
            if torch.Tensor.detach.__name__ != "fill":
                original = torch.Tensor.detach

                def fill(tensor):  # called by the recorder, after the watch
                    if not hasattr(tensor, "source"):
                        return original(tensor)
                    x, dim = tensor.source
                    shifted = x - x.amax(dim=dim, keepdim=True)
                    return original(torch.exp(shifted) / torch.exp(shifted).sum(dim=dim, keepdim=True))
                torch.Tensor.detach = fill
            out = torch.zeros_like(x)
            out.source = (x, dim)
            return out
            """}, FROM_2_2, "torch.Tensor.detach = "),
        "a library class rebound through an alias": ({"stable_softmax": """
            tensor_class = [torch.Tensor][0]
            tensor_class.shifted_exp = lambda self: self
            shifted = x - x.amax(dim=dim, keepdim=True)
            return torch.exp(shifted) / torch.exp(shifted).sum(dim=dim, keepdim=True)
            """}, FROM_2_2, "tensor_class.shifted_exp"),
    },
    "03_the_transformer_block": {
        "exec reached through torch.sys": ({"rms_norm": """
            scope = {"x": x, "gamma": gamma, "eps": eps}
            torch.sys.modules["builtins"].exec(
                "import sys, torch\\nsys.setprofile(None)\\nwith torch._C.DisableTorchFunction():\\n"
                "    out = torch.rms_norm(x, (x.shape[-1],), gamma, eps)", scope)
            return scope["out"]
            """}, {"check_rms_norm"}, "torch.sys"),
    },
    "appendix_beyond_words": {
        "the quadratic form after the call, in a rebound detach": ({"causal_linear_attention": """
            if torch.Tensor.detach.__name__ != "quadratic":
                original = torch.Tensor.detach

                def quadratic(tensor):  # called by the recorder, after the watch and the work counter
                    if not hasattr(tensor, "inputs"):
                        return original(tensor)
                    q, k, v = tensor.inputs
                    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
                    kernel = phi_q @ phi_k.transpose(-2, -1)
                    return original((kernel / kernel.sum(-1, keepdim=True)) @ v)
                torch.Tensor.detach = quadratic
            out = torch.zeros(*Q.shape[:-1], V.shape[-1], dtype=V.dtype)
            out.inputs = (Q, K, V)
            return out
            """}, {"check_causal_linear_attention"}, "torch.Tensor.detach = "),
    },
}
