// Run in a loaded book page (Playwright `page.evaluate`): waits until MathJax and the
// embedded widgets have rendered, then returns what the browser tests inspect.
async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const article = document.querySelector("article.bd-article") || document.body;
  const viewScripts = () =>
    [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const isRendered = (s) => !!(s.parentElement && s.parentElement.querySelector(".jupyter-widgets"));

  // 1. wait for MathJax, the widget manager and the fonts (at most ~10 s)
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await Promise.race([MathJax.startup.promise, sleep(10000)]);
  }
  for (let i = 0; i < 100 && !viewScripts().every(isRendered); i++) await sleep(100);
  await Promise.race([document.fonts.ready, sleep(5000)]);

  // 2. math: every typeset expression, and those MathJax could not parse
  const mathErrors = [];
  let mathCount = 0;
  if (window.MathJax && MathJax.startup && MathJax.startup.document) {
    for (const item of MathJax.startup.document.math) {
      mathCount++;
      const mml = MathJax.startup.toMML(item.root);
      if (/<merror|mathcolor="red"/.test(mml)) mathErrors.push(String(item.math).slice(0, 120));
    }
  }

  // 3. visible prose: text of the article outside math, code and outputs' <pre>
  // (Sphinx's span.math / div.math are kept: untypeset TeX stays in them.)
  const skip = "mjx-container, mjx-assistive-mml, pre, code, script, style, .highlight, " +
               ".cell_input, .headerlink";
  const prose = [];
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip)) continue;
    if (!el.checkVisibility || el.checkVisibility()) prose.push(n.nodeValue);
  }

  // 4. outputs that show an error
  const outputs = [...article.querySelectorAll(".cell_output")];
  const errorOutputs = [
    ...outputs.filter((o) => /Traceback \(most recent call last\)/.test(o.textContent))
      .map((o) => o.textContent.slice(0, 300)),
    ...[...article.querySelectorAll(".output.error, .output.traceback")].map((o) => o.textContent.slice(0, 300)),
    ...[...article.querySelectorAll(".output.stderr")].filter((o) => /Error/.test(o.textContent))
      .map((o) => o.textContent.slice(0, 300)),
  ];

  // outputs wider than their box: the reader would have to scroll sideways to read them
  const clipped = (sel) => [...article.querySelectorAll(sel)]
    .filter((e) => e.scrollWidth > e.clientWidth + 1)
    .map((e) => e.textContent.trim().split("\n").reduce((a, b) => (b.length > a.length ? b : a), ""));
  const clippedOutputs = clipped(".cell_output pre");
  const clippedInputs = clipped(".cell_input pre");

  // 5. images
  const images = [...document.querySelectorAll("img")].map((img) => {
    const fig = img.closest("figure");
    const cap = fig && fig.querySelector("figcaption");
    return {
      src: img.currentSrc || img.src,
      attr: img.getAttribute("src") || "",
      alt: (img.getAttribute("alt") || "").trim(),
      loaded: img.complete && img.naturalWidth > 0,
      width: img.naturalWidth,
      inArticle: article.contains(img),
      inCellOutput: !!img.closest(".cell_output"),
      inAnimation: !!img.closest(".animation"),
      inWidget: !!img.closest(".jupyter-widgets"),
      caption: cap ? cap.textContent.trim() : "",
    };
  });

  // 6. widgets, each with the cell it sits in and the cell after it
  const widgetRoots = new Set();
  for (const el of article.querySelectorAll('.jupyter-widgets, [class*="widget-"]')) {
    widgetRoots.add(el.closest(".cell_output") || el);
  }
  for (const s of viewScripts()) widgetRoots.add(s.closest(".cell_output") || s);
  const viewsIn = (root) => root.matches("script") ? [root]
    : [...root.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  const widgets = [...widgetRoots].map((root) => {
    const cell = root.closest(".cell");
    const next = cell ? cell.nextElementSibling : null;
    const nextIsCell = !!(next && next.matches(".cell"));
    const nextImgs = nextIsCell ? [...next.querySelectorAll(".cell_output img")] : [];
    return {
      cellClasses: cell ? cell.className : "(not in a notebook cell)",
      nextClasses: nextIsCell ? next.className : "(no code cell right after)",
      nextHasImage: nextImgs.some((i) => i.complete && i.naturalWidth > 0),
      nextHasAnimation: nextIsCell && !!next.querySelector(".cell_output .animation img"),
      rendered: viewsIn(root).every(isRendered),
    };
  });

  // 7. structure
  const goals = article.querySelector(".learning-goals");
  const firstH2 = article.querySelector("h2");
  const goalsBeforeH2 = !!goals && (!firstH2 ||
    !!(goals.compareDocumentPosition(firstH2) & Node.DOCUMENT_POSITION_FOLLOWING));
  const tables = [...article.querySelectorAll("table")].map((t) => ({
    header: [...t.querySelectorAll("thead th, tr:first-child th")].map((th) => th.textContent.trim()),
    rows: [...t.querySelectorAll("tbody tr")].map((tr) =>
      [...tr.querySelectorAll("td")].map((td) => td.textContent.trim())),
    links: [...t.querySelectorAll("a[href]")].map((a) => a.href),
  }));
  // search fields a reader sees (the sidebar's; a second bar would be a theme defect)
  const searchFields = [...document.querySelectorAll(".search-button-field")]
    .filter((el) => el.checkVisibility && el.checkVisibility()).length;

  return {
    url: location.href,
    title: document.title,
    h1: (article.querySelector("h1") || {}).textContent || "",
    theme: document.documentElement.dataset.theme || "",
    mjxCount: document.querySelectorAll("mjx-container").length,
    mathCount, mathErrors,
    prose: prose.join(" "),
    errorOutputs, clippedOutputs, clippedInputs, images, widgets,
    widgetViewScripts: viewScripts().length,
    goals: !!goals, goalsBeforeH2,
    prev: !!document.querySelector(".prev-next-area a.left-prev"),
    next: !!document.querySelector(".prev-next-area a.right-next"),
    prevNextArea: !!document.querySelector(".prev-next-area"),
    tables, searchFields,
    links: [...document.querySelectorAll("a[href]")].map((a) => a.href),
    background: getComputedStyle(document.body).backgroundColor,
  };
}
