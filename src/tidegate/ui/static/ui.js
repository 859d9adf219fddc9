// The dashboard's own script: the CSRF header on htmx requests, and the two charts.
// Plain JavaScript, no build step; uPlot and htmx are loaded before it.
"use strict";

(function () {
  var csrf = document.querySelector('meta[name="csrf-token"]');

  // Every request htmx makes carries the session's CSRF token; the server checks it
  // on anything that changes state.
  document.body.addEventListener("htmx:configRequest", function (event) {
    if (csrf && csrf.content) {
      event.detail.headers["X-CSRF-Token"] = csrf.content;
    }
  });

  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                 "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939"];
  var charts = {};

  function utcMinute(seconds) {
    return new Date(seconds * 1000).toISOString().slice(11, 16);
  }

  function draw(id, data, minutes) {
    var element = document.getElementById(id);
    if (!element) {
      return;
    }
    if (!data || data.series.length === 0) {
      element.textContent = "Nothing counted in the last 30 minutes.";
      if (charts[id]) {
        charts[id].destroy();
        delete charts[id];
      }
      return;
    }
    var columns = [minutes].concat(data.counts);
    var names = data.series.join("\u0000");
    var chart = charts[id];
    if (chart && chart.names === names) {
      chart.plot.setData(columns);
      return;
    }
    if (chart) {
      chart.plot.destroy();
    }
    element.textContent = "";
    var series = [{ value: function (u, v) { return v == null ? "" : utcMinute(v) + " UTC"; } }].concat(data.series.map(function (name, i) {
      return { label: name, stroke: PALETTE[i % PALETTE.length], width: 1.5 };
    }));
    var plot = new uPlot({
      width: Math.max(element.clientWidth, 300),
      height: 220,
      series: series,
      // Times as every page shows them: UTC, 24-hour (the axis says so).
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); },
      axes: [{ label: "UTC", values: function (u, splits) { return splits.map(utcMinute); } },
             { label: "per minute" }],
      scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
    }, columns, element);
    charts[id] = { plot: plot, names: names, destroy: function () { plot.destroy(); } };
  }

  function refresh() {
    if (!document.getElementById("admissions-chart")) {
      return;
    }
    fetch("/ui/api/activity", { credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 401) {
          window.location = "/ui/login";
          return null;
        }
        return response.ok ? response.json() : null;
      })
      .then(function (activity) {
        if (activity) {
          draw("throughput-chart", activity.throughput, activity.minutes);
          draw("admissions-chart", activity.admissions, activity.minutes);
        }
      })
      .catch(function () { /* the next poll tries again */ });
  }

  refresh();
  setInterval(refresh, 5000);

  // A fragment refused for want of a session: back to the sign-in page.
  document.body.addEventListener("htmx:responseError", function (event) {
    if (event.detail.xhr.status === 401) {
      window.location = "/ui/login";
    }
  });
})();
