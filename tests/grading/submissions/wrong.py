"""Known-wrong solutions: for each, the solution bodies substituted (by grade_id), the checks
that must catch it (and only those), and a phrase the first failing message must contain."""
from __future__ import annotations



def _attention(scores: str = "Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])", result: str = "weights @ V, weights"
               ) -> str:
    """Exercise 2.3's attention with its scores or its result written another way."""
    return f"""
            scores = {scores}
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            return {result}
            """


WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "01_data_independent_weights": {
        "embedding via W_E @ one_hot, wrong orientation": ({"embed_via_one_hot": """
            one_hot = F.one_hot(ids, num_classes=W_E.shape[0]).to(W_E.dtype)
            return W_E.T @ one_hot.T
            """}, {"check_embedding_lookup"}, "transposed"),
        "embedding by indexing instead of one-hot": ({"embed_via_one_hot": """
            return W_E[ids]
            """}, {"check_embedding_lookup"}, "indexing (W_E[ids]), a row lookup"),
        "embedding with F.embedding": ({"embed_via_one_hot": """
            return F.embedding(ids, W_E)
            """}, {"check_embedding_lookup"}, "torch's embedding on W_E, a row lookup"),
        "embedding through numpy indexing": ({"embed_via_one_hot": """
            return torch.from_numpy(W_E.numpy()[ids.numpy()])
            """}, {"check_embedding_lookup"}, "torch's numpy on W_E"),
        "embedding through numpy indexing, detached first": ({"embed_via_one_hot": """
            return torch.from_numpy(W_E.detach().numpy()[ids.numpy()])
            """}, {"check_embedding_lookup"}, "torch's numpy on W_E"),
        "embedding by unbinding the rows of W_E": ({"embed_via_one_hot": """
            rows = W_E.unbind(0)
            return torch.stack([rows[i] for i in ids.reshape(-1).tolist()]).reshape(*ids.shape, -1)
            """}, {"check_embedding_lookup"}, "torch's unbind on W_E"),
        "embedding by iterating over W_E": ({"embed_via_one_hot": """
            rows = list(W_E)
            return torch.stack([rows[i] for i in ids.reshape(-1).tolist()]).reshape(*ids.shape, -1)
            """}, {"check_embedding_lookup"}, "on W_E, a row lookup"),
        "embedding via one_hot without num_classes": ({"embed_via_one_hot": """
            return F.one_hot(ids).to(W_E.dtype) @ W_E
            """}, {"check_embedding_lookup"}, "num_classes"),
        "embedding detached from W_E": ({"embed_via_one_hot": """
            one_hot = F.one_hot(ids, num_classes=W_E.shape[0]).to(W_E.dtype)
            return one_hot @ W_E.detach()
            """}, {"check_embedding_lookup"}, "no gradient"),
        "embedding whose gradient does not reach W_E": ({"embed_via_one_hot": """
            one_hot = F.one_hot(ids, num_classes=W_E.shape[0]).to(W_E.dtype)
            return one_hot @ W_E.detach() + 0 * W_E.sum()
            """}, {"check_embedding_lookup"}, "one_hotᵀ · G"),
        "NW on vectors without the keys' norms": ({"nw_vectors": """
            weights = torch.softmax(Q @ K.T / bandwidth**2, dim=-1)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "the keys' norms do not cancel"),
        "NW on vectors through the (q, m, d) differences": ({"nw_vectors": """
            squared = ((Q[:, None, :] - K[None, :, :]) ** 2).sum(dim=-1)
            weights = torch.softmax(-squared / (2 * bandwidth**2), dim=-1)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "computed a tensor of 120 numbers"),
        "NW on vectors, one query at a time": ({"nw_vectors": """
            rows = []
            for x in Q:
                squared = ((K - x) ** 2).sum(dim=-1)
                rows.append(torch.softmax(-squared / (2 * bandwidth**2), dim=-1))
            weights = torch.stack(rows)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "torch operations for 50 queries"),
        "NW on vectors, kernel without the 2": ({"nw_vectors": """
            weights = torch.softmax((2 * Q @ K.T - (K * K).sum(dim=-1)) / bandwidth**2, dim=-1)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "kernel width"),
        "NW on vectors dividing by h, not h squared": ({"nw_vectors": """
            weights = torch.softmax((Q @ K.T - (K * K).sum(dim=-1) / 2) / bandwidth, dim=-1)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "bandwidth squared"),
        "NW on vectors, weights not normalised": ({"nw_vectors": """
            scores = (Q @ K.T - (K * K).sum(dim=-1) / 2) / bandwidth**2
            weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "do not sum to 1"),
        "NW on vectors, weights transposed": ({"nw_vectors": """
            weights = torch.softmax((Q @ K.T - (K * K).sum(dim=-1) / 2) / bandwidth**2, dim=-1)
            return weights @ V, weights.T
            """}, {"check_nw_vectors"}, "transposed"),
        "NW on vectors, kernel values without the softmax's shift": ({"nw_vectors": """
            kernel = torch.exp((Q @ K.T - (K * K).sum(dim=-1) / 2 - (Q * Q).sum(dim=-1, keepdim=True) / 2)
                               / bandwidth**2)
            weights = kernel / kernel.sum(dim=-1, keepdim=True)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "weights contains"),
        "NW on vectors with torch.cdist": ({"nw_vectors": """
            weights = torch.softmax(-torch.cdist(Q, K) ** 2 / (2 * bandwidth**2), dim=-1)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "torch's cdist"),
        "NW on vectors with the course library's softmax": ({"nw_vectors": """
            from transformer_lib.attention import softmax as library_softmax
            weights = library_softmax((Q @ K.T - (K * K).sum(dim=-1) / 2) / bandwidth**2)
            return weights @ V, weights
            """}, {"check_nw_vectors"}, "the course library (attention.softmax)"),
        "equivariant part: W itself": ({"equivariant_part": """
            return W.clone()
            """}, {"check_equivariant_part"}, "that is W itself"),
        "equivariant part: the mean of all entries": ({"equivariant_part": """
            return torch.full_like(W, float(W.mean()))
            """}, {"check_equivariant_part"}, "never off the diagonal"),
        "equivariant part: W symmetrised": ({"equivariant_part": """
            return (W + W.T) / 2
            """}, {"check_equivariant_part"}, "averaging W and Wᵀ is not enough"),
        "equivariant part: the cyclic shifts only": ({"equivariant_part": """
            n = W.shape[0]
            return sum(torch.roll(W, (k, k), dims=(0, 1)) for k in range(n)) / n
            """}, {"check_equivariant_part"}, "the n cyclic shifts only"),
        "equivariant part: the diagonal only": ({"equivariant_part": """
            return torch.diagonal(W).mean() * torch.eye(W.shape[0], dtype=W.dtype)
            """}, {"check_equivariant_part"}, "not to 0"),
        "equivariant part: an average over random permutations": ({"equivariant_part": """
            n = W.shape[0]
            g = torch.Generator().manual_seed(0)
            total = torch.zeros_like(W)
            for _ in range(500):
                perm = torch.randperm(n, generator=g)
                total += W[perm][:, perm]
            return total / 500
            """}, {"check_equivariant_part"}, "does not commute with a permutation"),
        "fixed mixing question: any number of rows": ({"fixed_mixing_answer": """
            answer_fixed_mixing = "a"
            """}, {"check_fixed_mixing_answer"}, "inner dimensions"),
        "fixed mixing question: the token width changes": ({"fixed_mixing_answer": """
            answer_fixed_mixing = "c"
            """}, {"check_fixed_mixing_answer"}, "blames the width d"),
        "fixed mixing question: padding fixes it": ({"fixed_mixing_answer": """
            answer_fixed_mixing = "D"
            """}, {"check_fixed_mixing_answer"}, "of 13 tokens"),
        "fixed mixing question: not a letter": ({"fixed_mixing_answer": """
            answer_fixed_mixing = 2
            """}, {"check_fixed_mixing_answer"}, "one of the letters"),
    },
    "02_building_up_attention": {
        "scores typed transposed (K Q^T)": ({"hand_scores": """
            S = torch.tensor([[5.0, 4.0, 7.0], [3.0, 2.0, 3.0], [6.0, 4.0, 6.0]])
            S_symmetric = False
            """}, {"check_hand_scores"}, "S[0, 1] = 4, S[0, 2] = 7"),
        "one score miscomputed by hand": ({"hand_scores": """
            S = torch.tensor([[5.0, 3.0, 6.0], [4.0, 2.0, 4.0], [7.0, 3.0, 5.0]])
            S_symmetric = False
            """}, {"check_hand_scores"}, "wrong entries (1 of 9), your values: S[2, 2] = 5"),
        "S called symmetric": ({"hand_scores": """
            S = torch.tensor([[5.0, 3.0, 6.0], [4.0, 2.0, 4.0], [7.0, 3.0, 6.0]])
            S_symmetric = True
            """}, {"check_hand_scores"}, "S_symmetric: S is symmetric when"),
        "symmetry answered with a string": ({"hand_scores": """
            S = torch.tensor([[5.0, 3.0, 6.0], [4.0, 2.0, 4.0], [7.0, 3.0, 6.0]])
            S_symmetric = "no"
            """}, {"check_hand_scores"}, "must be True or False"),
        "hand weights to 2 decimals only": ({"hand_weights": """
            A = torch.tensor([[0.31, 0.07, 0.62], [0.45, 0.11, 0.45], [0.64, 0.04, 0.32]])
            Z = torch.tensor([[1.31, 1.62], [1.45, 1.45], [1.64, 1.32]])
            A_row_sum = 1.0
            """}, {"check_hand_weights"}, "right to 2 decimals but not to 3"),
        "row sum of the whole matrix": ({"hand_weights": """
            A = torch.tensor([[0.306, 0.074, 0.620], [0.446, 0.108, 0.446], [0.644, 0.038, 0.318]])
            Z = torch.tensor([[1.306, 1.620], [1.446, 1.446], [1.644, 1.318]])
            A_row_sum = 3.0
            """}, {"check_hand_weights"}, "the sum of the whole matrix"),
        "hand weights without 1/sqrt(d_k)": ({"hand_weights": """
            A = torch.softmax(S.double(), dim=-1)
            Z = A @ V.double()
            A_row_sum = 1.0
            """}, {"check_hand_weights"}, "√d_k"),
        "softmax over the wrong axis": ({"stable_softmax": """
            shifted = x - x.amax(dim=0, keepdim=True)
            exponentials = torch.exp(shifted)
            return exponentials / exponentials.sum(dim=0, keepdim=True)
            """}, {"check_stable_softmax"}, "wrong axis"),
        "softmax whose row sums lose their dimension (no keepdim)": ({"stable_softmax": """
            exponentials = torch.exp(x - x.amax(dim=dim, keepdim=True))
            return exponentials / exponentials.sum(dim=dim)
            """}, {"check_stable_softmax"}, "the row sums need keepdim=True to broadcast"),
        "naive softmax that overflows": ({"stable_softmax": """
            exponentials = torch.exp(x)
            return exponentials / exponentials.sum(dim=dim, keepdim=True)
            """}, {"check_stable_softmax"}, "overflow"),
        "softmax via torch.softmax": ({"stable_softmax": """
            return torch.softmax(x, dim=dim)
            """}, {"check_stable_softmax"}, "from scratch"),
        "softmax via torch.softmax, torch function modes switched off": ({"stable_softmax": """
            with torch._C.DisableTorchFunction():
                return torch.softmax(x, dim)
            """}, {"check_stable_softmax"}, "from scratch"),
        "softmax via logsumexp": ({"stable_softmax": """
            return torch.exp(x - torch.logsumexp(x, dim=dim, keepdim=True))
            """}, {"check_stable_softmax"}, "torch's logsumexp"),
        "softmax from the course library": ({"stable_softmax": """
            from transformer_lib.attention import softmax as library_softmax
            return library_softmax(x, dim)
            """}, {"check_stable_softmax"}, "the course library (attention.softmax)"),
        "attention missing 1/sqrt(d_k)": ({"attention": """
            scores = Q @ K.transpose(-2, -1)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-1)
            return weights @ V, weights
            """}, {"check_attention", "check_masked_attention"}, "√d_k"),
        "attention from the course library": ({"attention": """
            from transformer_lib import attention as library
            return library.scaled_dot_product_attention(Q, K, V, mask=mask)
            """}, {"check_attention", "check_masked_attention"}, "the course library"),
        "attention mask applied after the softmax": ({"attention": """
            scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
            weights = torch.softmax(scores, dim=-1)
            if mask is not None:
                weights = weights * mask
            return weights @ V, weights
            """}, {"check_masked_attention"}, "after the softmax"),
        "attention with transposed weights": ({"attention": """
            scores = K @ Q.transpose(-2, -1) / math.sqrt(Q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask.transpose(-2, -1), float("-inf"))
            weights = torch.softmax(scores, dim=-2)
            return weights.transpose(-2, -1) @ V, weights
            """}, {"check_attention", "check_masked_attention"}, "transposed"),
        "attention softmax over the queries": ({"attention": """
            scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = torch.softmax(scores, dim=-2)
            return weights @ V, weights
            """}, {"check_attention", "check_masked_attention"}, "wrong axis"),
        "score std answered with the variance": ({"variance_questions#0": """
            return float(d_k)
            """}, {"check_score_std"}, "variance"),
        "score range of one standard deviation": ({"variance_questions#1": """
            return (-math.sqrt(d_k), math.sqrt(d_k))
            """}, {"check_score_range"}, "±1 standard deviation"),
        "dividing by d_k confused with dividing by sqrt(d_k)": ({"variance_questions#2": """
            return 1.0
            """}, {"check_variance_divided_by_dk"}, "d_k²"),
        "score std hard-coded to the visible answer": ({"variance_questions#0": """
            return {1: 1.0, 64: 8.0}.get(d_k, 16.0)
            """}, {"check_score_std"}, "a hidden test (other inputs) fails: score_std(#) is not right"),
        "score std hard-coded to the answer for d_k = 256": ({"variance_questions#0": """
            return 16.0
            """}, {"check_score_std"}, "score_std(1) is not right"),
        "variance after dividing by d_k hard-coded to the answer for d_k = 256": ({"variance_questions#2": """
            return 1 / 256
            """}, {"check_variance_divided_by_dk"}, "variance_divided_by_dk(1) is not right"),
        "attention with K.T (reverses every dimension of a batch)": ({"attention": _attention(
            scores="Q @ K.T / math.sqrt(Q.shape[-1])")}, {"check_attention", "check_masked_attention"},
            "transpose(-2, -1) swaps the last two"),
        "attention scaled by the number of keys": ({"attention": _attention(
            scores="Q @ K.transpose(-2, -1) / math.sqrt(K.shape[-2])")}, {"check_attention", "check_masked_attention"},
            "A differs from softmax"),
        "attention returning (A, Z)": ({"attention": _attention(result="weights, weights @ V")},
                                       {"check_attention", "check_masked_attention"}, "A has the wrong shape"),
        "attention ignoring the mask": ({"attention": """
            scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
            weights = torch.softmax(scores, dim=-1)
            return weights @ V, weights
            """}, {"check_masked_attention"}, "weights at masked positions must be exactly 0"),
        "permuted mask left unchanged": ({"permuted_mask": """
            return mask.clone()
            """}, {"check_permuted_mask"}, "that is the mask unchanged"),
        "permuted mask moved the other way": ({"permuted_mask": """
            inverse = torch.argsort(perm)
            return mask[inverse][:, inverse]
            """}, {"check_permuted_mask"}, "moves the mask the other way"),
        "permuted mask with only its rows moved": ({"permuted_mask": """
            return mask[perm]
            """}, {"check_permuted_mask"}, "only the rows moved"),
        "permuted mask with only its columns moved": ({"permuted_mask": """
            return mask[:, perm]
            """}, {"check_permuted_mask"}, "only the columns moved"),
        "permuted mask transposed": ({"permuted_mask": """
            return mask[perm][:, perm].T
            """}, {"check_permuted_mask"}, "the mask is transposed"),
        "permuted mask as numbers": ({"permuted_mask": """
            return mask[perm][:, perm].float()
            """}, {"check_permuted_mask"}, "must return a boolean tensor"),
        "permuted mask rebuilt as a causal mask for the visible example": ({"permuted_mask": """
            n = len(perm)
            return (perm[None, :] <= perm[:, None]) & torch.ones(n, n, dtype=torch.bool)
            """}, {"check_permuted_mask"}, "attention with this mask on the reordered tokens"),
    },
}
# Known-wrong submissions that only the hidden tests can catch (each with the reason the visible
# check cannot); every other one must fail the visible check, the one a student runs.
HIDDEN_ONLY: dict[str, str] = {
    "slopes: the visible answers looked up": "a table of the visible answers is right on every visible input",
    "score std hard-coded to the visible answer": "a table of the visible answers is right on every visible input",
}
from submissions.wrong_ch03 import WRONG as _ch03; WRONG.update(_ch03)  # noqa: E402, E702

from submissions.wrong_ch04 import WRONG as _ch04  # noqa: E402

WRONG.update(_ch04)
from submissions.wrong_ch05 import WRONG as _ch05  # noqa: E402
WRONG.update(_ch05)
from submissions.wrong_ch07 import WRONG as _ch07  # noqa: E402
WRONG.update(_ch07)
from submissions.wrong_ch09 import WRONG as _ch09  # noqa: E402
WRONG.update(_ch09)
from submissions.wrong_ch06 import WRONG as _ch06  # noqa: E402
WRONG.update(_ch06)
from submissions.wrong_ch08 import WRONG as _ch08  # noqa: E402
WRONG.update(_ch08)
from submissions.wrong_ch10 import WRONG as _ch10  # noqa: E402
WRONG.update(_ch10)
from submissions.wrong_ch11 import WRONG as _ch11  # noqa: E402
WRONG.update(_ch11)
from submissions.wrong_ch12 import WRONG as _ch12  # noqa: E402
WRONG.update(_ch12)
