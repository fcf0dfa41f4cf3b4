// kgpt results pages: charts to zoom and hover on, drawn with uPlot (inlined beside this
// script; gpt2/results/charts.py says why uPlot). Each <script type="application/json"
// data-chart> holds one chart: {title, x_label, y_label, x: [...], series: [{label,
// values}]}, values null where a series has no point (title null: the page's heading
// names it). The chart is drawn where the script is. Hovering shows the step and the values there (with many series, the
// one nearest the cursor); dragging across selects a range to zoom into; a double click
// zooms out again.
(function () {
  var COLORS = ["#2f5bd3", "#d9480f", "#2b8a3e", "#ae3ec9", "#e67700", "#0c8599",
                "#c2255c", "#5c940d", "#364fc7", "#862e9c"];
  var MANY = 8;  // above this many series, the tooltip names the nearest one only
  var HEIGHT = 320;

  function fmt(v) {
    return v === null || v === undefined ? "-" : (Math.abs(v) >= 100 ? v.toFixed(1) : v.toFixed(4));
  }

  function tooltip(data) {
    var tip = document.createElement("div");
    tip.className = "chart-tip";
    tip.style.display = "none";
    function nearest(u, idx, top) {
      var best = null, dist = Infinity;
      for (var i = 1; i < u.series.length; i++) {
        var v = u.data[i][idx];
        if (v === null || v === undefined || !u.series[i].show) continue;
        var d = Math.abs(u.valToPos(v, "y") - top);
        if (d < dist) { dist = d; best = i; }
      }
      return best;
    }
    return {
      hooks: {
        init: [function (u) { u.over.appendChild(tip); }],
        setCursor: [function (u) {
          var idx = u.cursor.idx, left = u.cursor.left, top = u.cursor.top;
          if (idx === null || idx === undefined || left < 0) { tip.style.display = "none"; return; }
          var lines = [data.x_label + " " + u.data[0][idx].toLocaleString("en")];
          if (data.series.length > MANY) {
            var i = nearest(u, idx, top);
            if (i !== null) lines.push(u.series[i].label + ": " + fmt(u.data[i][idx]));
          } else {
            for (var j = 1; j < u.series.length; j++) {
              if (u.data[j][idx] !== null && u.data[j][idx] !== undefined)
                lines.push(u.series[j].label + ": " + fmt(u.data[j][idx]));
            }
          }
          tip.textContent = "";
          lines.forEach(function (line, k) {
            var row = document.createElement("div");
            if (k === 0) row.className = "chart-tip-x";
            row.textContent = line;
            tip.appendChild(row);
          });
          tip.style.display = "";
          var flip = left > u.over.clientWidth * 0.6;
          tip.style.left = (flip ? left - tip.offsetWidth - 12 : left + 12) + "px";
          tip.style.top = Math.max(0, top - tip.offsetHeight - 8) + "px";
        }],
      },
    };
  }

  function draw(script, data) {
    var holder = script.parentNode;
    var many = data.series.length > MANY;
    var series = [{label: data.x_label}];
    data.series.forEach(function (s, i) {
      var sparse = s.values.filter(function (v) { return v !== null; }).length < 60;
      series.push({label: s.label, stroke: COLORS[i % COLORS.length], width: many ? 1.25 : 1.75,
                   spanGaps: true, points: {show: sparse && !many, size: 5},
                   value: function (u, v) { return fmt(v); }});
    });
    var box = document.createElement("div");
    box.className = "chart";
    holder.insertBefore(box, script);
    var width = function () { return Math.max(320, holder.clientWidth - 8); };
    var chart = new uPlot({
      title: data.title || undefined, width: width(), height: HEIGHT, series: series,
      scales: {x: {time: false}},
      axes: [{label: data.x_label}, {label: data.y_label, size: 60}],
      legend: {show: !many, live: true},
      cursor: {drag: {x: true, y: false, setScale: true}, focus: {prox: 24}},
      focus: {alpha: many ? 0.25 : 1},
      plugins: [tooltip(data)],
    }, [data.x].concat(data.series.map(function (s) { return s.values; })), box);
    window.addEventListener("resize", function () { chart.setSize({width: width(), height: HEIGHT}); });
    return chart;
  }

  document.addEventListener("DOMContentLoaded", function () {
    window.kgptCharts = [];
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll('script[type="application/json"][data-chart]').forEach(function (s) {
      window.kgptCharts.push(draw(s, JSON.parse(s.textContent)));
    });
  });
})();
