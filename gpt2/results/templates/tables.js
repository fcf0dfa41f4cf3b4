// kgpt results pages: sortable tables and a filter box, inlined into every page.
// A header cell sorts its column (numbers by data-v, else by text; missing values last);
// an <input data-filter="id"> hides the rows of table#id that do not contain its words.
(function () {
  function value(cell) {
    if (!cell) return null;
    var v = cell.getAttribute("data-v");
    if (v !== null) return v === "" ? null : parseFloat(v);
    var t = cell.textContent.trim();
    return t === "" || t === "n/a" || t === "-" ? null : t.toLowerCase();
  }
  function sortBy(table, th) {
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var descending = th.getAttribute("aria-sort") === "ascending";
    Array.prototype.forEach.call(th.parentNode.children, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = value(a.cells[index]), y = value(b.cells[index]);
      if (x === null && y === null) return 0;
      if (x === null) return 1;
      if (y === null) return -1;
      var order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return descending ? -order : order;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  function filter(input) {
    var table = document.getElementById(input.getAttribute("data-filter"));
    var words = input.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var text = row.textContent.toLowerCase();
      var keep = words.every(function (w) { return text.indexOf(w) >= 0; });
      row.style.display = keep ? "" : "none";
      if (keep) shown += 1;
    });
    var counter = document.querySelector('[data-shown="' + table.id + '"]');
    if (counter) counter.textContent = shown + " of " + table.tBodies[0].rows.length + " shown";
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable thead th").forEach(function (th) {
      th.addEventListener("click", function () { sortBy(th.closest("table"), th); });
    });
    document.querySelectorAll("input[data-filter]").forEach(function (input) {
      input.addEventListener("input", function () { filter(input); });
      filter(input);
    });
  });
})();
