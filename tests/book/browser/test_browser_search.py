"""The book's full-text search (Sphinx's search page) finds a chapter by a term it defines."""
from __future__ import annotations

import pytest

# term -> the chapter that defines it
TERMS = [
    ("Nadaraya", "chapters/01_data_independent_weights.html"),
    ("equivariance", "chapters/02_building_up_attention.html"),
    ("softmax", "chapters/02_building_up_attention.html"),
    ("collapse", "chapters/03_the_transformer_block.html"),
    ("highway", "chapters/04_the_residual_stream.html"),
    ("buyback", "chapters/05_multi_head_attention.html"),
    ("rotary", "chapters/06_positional_information.html"),
    ("teacher", "chapters/07_causal_masking.html"),
    ("Mixtral", "chapters/08_mixture_of_experts.html"),
    ("crossover", "chapters/09_parameter_and_flop_counting.html"),
    ("Longformer", "chapters/appendix_beyond_words.html"),
    ("WordPiece", "chapters/appendix_tokens.html"),
    ("IsoFLOP", "chapters/appendix_scaling.html"),
]

WAIT_FOR_RESULTS = """async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  for (let i = 0; i < 100; i++) {
    const summary = document.querySelector("#search-results p.search-summary");
    if (summary && summary.textContent.trim()) break;
    await sleep(100);
  }
  return [...document.querySelectorAll("#search-results ul.search li a")]
    .map((a) => a.href.split("?")[0].split("#")[0]);
}"""


def test_every_chapter_has_a_search_term(all_page_paths):
    """A new chapter must add a term it defines to TERMS, so its search is tested too."""
    covered = {chapter for _, chapter in TERMS}
    missing = [p for p in all_page_paths if p.startswith("chapters/") and p not in covered]
    assert not missing, f"add a term each of these chapters defines to TERMS: {missing}"


@pytest.mark.parametrize(("term", "chapter"), TERMS)
def test_search_finds_the_chapter(visitor, all_page_paths, term, chapter):
    if chapter not in all_page_paths:
        pytest.skip(f"{chapter} is not in the book yet")
    page, report = visitor.new_page()
    try:
        page.goto(f"{visitor.base_url}search.html?q={term}", wait_until="load")
        hits = page.evaluate(WAIT_FOR_RESULTS)
    finally:
        page.context.close()
    assert visitor.base_url + chapter in hits, f"searching {term!r} found {hits}, not {chapter}"
    assert not report.aborted, f"the search page asked other hosts for {report.aborted}"
