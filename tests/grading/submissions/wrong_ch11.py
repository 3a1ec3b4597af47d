"""Known-wrong solutions of Exercises 11 (format of ``wrong.py``): the solution bodies substituted
(by grade_id), the checks that must catch them (and only those), a phrase of the first message."""
from __future__ import annotations

_MERGE = {"check_merge_step"}
_CHANGES = {"check_pair_changes"}
_STREAM = {"check_stream_decode"}

_MERGE_WORDS = """
    merged_words = []
    for word in words:
        out, i = [], 0
        while i < len(word):
            if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                out.append(best[0] + best[1])
                i += 2
            else:
                out.append(word[i])
                i += 1
        merged_words.append(out)
    return best, merged_words
"""

_COUNTED = """
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    best = max(pairs, key=lambda p: (pairs[p], p))
"""

_MERGED = """
    merged, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(pair[0] + pair[1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
"""

_UPDATE = """
    a, b = pair
    ab = a + b
    starts = set()
    for w, i in at:
        if (w, i - 1) not in starts:
            starts.add((w, i))
    changes = Counter()
    for w, i in starts:
        word, f = words[w], counts[w]
        changes[pair] -= f
        if i > 0 and (w, i - 2) not in starts:
            x = word[i - 1]
            changes[x, a] -= f
            changes[x, ab] += f
        if (w, i + 2) in starts:
            changes[b, a] -= f
            changes[ab, ab] += f
        elif i + 2 < len(word):
            y = word[i + 2]
            changes[b, y] -= f
            changes[ab, y] += f
    return {p: k for p, k in changes.items() if k}
"""

WRONG: dict[str, dict[str, tuple[dict[str, str], set[str], str]]] = {
    "appendix_tokens": {
        "merge step: ties to the smaller pair": ({"merge_step": """
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    best = max(pairs, key=lambda p: (pairs[p], tuple(-ord(c) for c in p[0] + p[1])))
""" + _MERGE_WORDS}, _MERGE, "take the greater one"),
        "merge step: the first pair found among the tied (Counter.most_common)": ({"merge_step": """
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    best = pairs.most_common(1)[0][0]
""" + _MERGE_WORDS}, _MERGE, "take the greater one"),
        "merge step: counts ignored": ({"merge_step": """
    pairs = Counter()
    for word in words:
        for pair in zip(word, word[1:]):
            pairs[pair] += 1
    best = max(pairs, key=lambda p: (pairs[p], p))
""" + _MERGE_WORDS}, _MERGE, "weight them by its count"),
        "merge step: pairs counted across words": ({"merge_step": """
    text = [s for word, count in zip(words, counts) for _ in range(count) for s in word]
    pairs = Counter(zip(text, text[1:]))
    best = max(pairs, key=lambda p: (pairs[p], p))
""" + _MERGE_WORDS}, _MERGE, "never across two words"),
        "merge step: merged right to left": ({"merge_step": """
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    best = max(pairs, key=lambda p: (pairs[p], p))
    merged_words = []
    for word in words:
        out, i = [], len(word) - 1
        while i >= 0:
            if i > 0 and (word[i - 1], word[i]) == best:
                out.insert(0, best[0] + best[1])
                i -= 2
            else:
                out.insert(0, word[i])
                i -= 1
        merged_words.append(out)
    return best, merged_words
"""}, _MERGE, "merge the occurrences left to right"),
        "merge step: a final unmerged symbol dropped": ({"merge_step": _COUNTED + _MERGE_WORDS.replace(
            "while i < len(word):\n            if i + 1 < len(word) and", "while i + 1 < len(word):\n            if")},
            _MERGE, "the last symbol of a word"),
        "merge step: the appendix's loop body, special tokens counted (the copy that passed before)": (
            {"merge_step": _COUNTED + _MERGE_WORDS}, _MERGE, "a special symbol is never part of a merge"),
        "merge step: the words not merged": ({"merge_step": """
    pairs = Counter()
    for word, count in zip(words, counts):
        for pair in zip(word, word[1:]):
            pairs[pair] += count
    return max(pairs, key=lambda p: (pairs[p], p)), words
"""}, _MERGE, "returned unmerged"),
        "merge step: the course library": ({"merge_step": """
    from transformer_lib.bpe import train_bpe
    return train_bpe("".join(words[0]), 257)
"""}, _MERGE, "the course library"),
        "pair changes: merge, recount every word and subtract (the solution that passed before)": (
            {"pair_changes": """
    changes = Counter()
    for word, f in zip(words, counts):
        word = list(word)
""" + _MERGED.replace("\n    ", "\n        ") + """
        for p in zip(merged, merged[1:]):
            changes[p] += f
        for p in zip(word, word[1:]):
            changes[p] -= f
    return {p: k for p, k in changes.items() if k}
"""}, _CHANGES, "in proportion to the corpus"),
        "pair changes: recount only the words that hold the pair": ({"pair_changes": """
    changes = Counter()
    for w in sorted({w for w, _ in at}):
        word, f = list(words[w]), counts[w]
""" + _MERGED.replace("\n    ", "\n        ") + """
        for p in zip(merged, merged[1:]):
            changes[p] += f
        for p in zip(word, word[1:]):
            changes[p] -= f
    return {p: k for p, k in changes.items() if k}
"""}, _CHANGES, "in proportion to the corpus"),
        "pair changes: the signs flipped": ({"pair_changes": _UPDATE.replace("-= f", "+= F").replace(
            "+= f", "-= f").replace("+= F", "+= f")}, _CHANGES, "the signs are flipped"),
        "pair changes: counts ignored": ({"pair_changes": _UPDATE.replace("f = words[w], counts[w]", "f = words[w], 1")},
                                         _CHANGES, "multiply its changes by counts[w]"),
        "pair changes: each occurrence on its own": ({"pair_changes": _UPDATE.replace(
            "if i > 0 and (w, i - 2) not in starts:", "if i > 0:").replace("if (w, i + 2) in starts:", "if False:")},
            _CHANGES, "side by side"),
        "pair changes: every listed place merged, also the overlapping ones of a run": ({"pair_changes": _UPDATE.replace(
            "if (w, i - 1) not in starts:", "if True:")}, _CHANGES, "overlap"),
        "pair changes: the symbol before an occurrence at the start of a word read as words[w][-1]": (
            {"pair_changes": _UPDATE.replace("if i > 0 and (w, i - 2)", "if (w, i - 2)")}, _CHANGES,
            "no symbol before it"),
        "pair changes: a list of pairs": ({"pair_changes": """
    return [tuple(p) for w, i in at for p in [(words[w][i], words[w][i + 1])]]
"""}, _CHANGES, "must return a dict"),
        "stream decode: each token on its own": ({"stream_decode": """
    return [bytes(token).decode("utf-8", errors="replace") for token in tokens]
"""}, _STREAM, "decoded on its own"),
        "stream decode: broken bytes dropped": ({"stream_decode": """
    return [bytes(token).decode("utf-8", errors="ignore") for token in tokens]
"""}, _STREAM, "bytes were dropped"),
        "stream decode: everything at the end": ({"stream_decode": """
    data = b"".join(bytes(token) for token in tokens)
    return [""] * (len(tokens) - 1) + [data.decode("utf-8", errors="replace")]
"""}, _STREAM, "shown too late or too early"),
        "stream decode: the unfinished end dropped": ({"stream_decode": """
    shown, pending = [], b""
    for token in tokens:
        pending += bytes(token)
        for cut in range(len(pending), -1, -1):
            try:
                shown.append(pending[:cut].decode("utf-8"))
                break
            except UnicodeDecodeError:
                continue
        pending = pending[cut:]
    return shown
"""}, _STREAM, "after the last token"),
    },
}
