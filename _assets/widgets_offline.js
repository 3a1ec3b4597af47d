// Loaded between require.js and the ipywidgets HTML manager (nb_ipywidgets_js in
// _config.yml). It makes the embedded widgets work offline and with MathJax 3:
// - the manager loads its icon fonts (and any widget module) from this book's
//   _static/vendor/ folder instead of a CDN;
// - widget labels are typeset through MathJax 3 (the controls call MathJax 2's
//   MathJax.Hub.Queue, which MathJax 3 does not have).
(function () {
  var here = document.currentScript && document.currentScript.src;
  if (!here) { return; }
  var vendor = new URL("vendor/", here).href;
  window.__jupyter_widgets_assets_path__ = vendor + "html-manager/";
  if (window.requirejs) {
    window.requirejs.config({
      paths: { "@jupyter-widgets/html-manager/dist": vendor + "html-manager" }
    });
  }
  function typesetLater(args) {
    var element = args && args[2];
    var mj = window.MathJax;
    if (!element || !mj || !mj.startup || !mj.typesetPromise) { return; }
    mj.startup.promise.then(function () { return mj.typesetPromise([element]); });
  }
  // MathJax is loaded with `defer`: it exists once the document is parsed.
  document.addEventListener("DOMContentLoaded", function () {
    if (window.MathJax && window.MathJax.version && !window.MathJax.Hub) {
      window.MathJax.Hub = { Queue: typesetLater };
    }
  });
})();
