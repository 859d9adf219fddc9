// The dashboard's own script: the CSRF header on htmx requests, the pause of a list's
// refresh while a form is being filled, the overview's two charts and the tasks' charts.
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

  // A list page polls its own address for its rows (data-live, hx-select). A poll is
  // skipped while the person is filling a form: a field has the focus, or some field
  // holds what they typed and have not sent. The rows swap under an unmoved page: the
  // scroll positions stay, and so do the filters, which the polled address carries.
  function filling() {
    var active = document.activeElement;
    if (active && active.form && /^(INPUT|SELECT|TEXTAREA)$/.test(active.tagName)) {
      return true;
    }
    return Array.prototype.some.call(document.forms, function (form) {
      return Array.prototype.some.call(form.elements, function (field) {
        if (field.type === "checkbox" || field.type === "radio") {
          return field.checked !== field.defaultChecked;
        }
        if (field.tagName === "SELECT") {  // none marked selected: the first is shown
          var first = Array.prototype.findIndex.call(field.options, function (option) {
            return option.defaultSelected;
          });
          return field.selectedIndex !== Math.max(first, 0);
        }
        return field.type !== "hidden" && "defaultValue" in field && field.value !== field.defaultValue;
      });
    });
  }

  document.body.addEventListener("htmx:beforeRequest", function (event) {
    var element = event.detail.elt;
    if (element.hasAttribute("data-live") && (document.hidden || filling())) {
      event.preventDefault();
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
      element.textContent = "Nothing counted in the last " + minutes.length + " minutes.";
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

  // Read a chart's figures and hand them to `use`: a lapsed session goes to sign-in, and
  // a failed read is left for the next poll.
  function poll(url, use) {
    fetch(url, { credentials: "same-origin" })
      .then(function (response) {
        if (response.status === 401) {
          window.location = "/ui/login";
          return null;
        }
        return response.ok ? response.json() : null;
      })
      .then(function (activity) {
        if (activity) {
          use(activity);
        }
      })
      .catch(function () { /* the next poll tries again */ });
  }

  function refresh() {
    if (!document.getElementById("admissions-chart")) {
      return;
    }
    poll("/ui/api/activity", function (activity) {
      draw("throughput-chart", activity.throughput, activity.minutes);
      draw("admissions-chart", activity.admissions, activity.minutes);
    });
  }

  // The tasks page: a chart per task, in the order the server gives (the most attempts
  // first); a task's figure is made the first time it is in the data, and removed when
  // it is no longer.
  var taskCharts = {};  // task name -> its chart's element id
  var taskChartsMade = 0;

  function drawTasks(activity) {
    var box = document.getElementById("task-charts");
    var kept = {};
    var drawn = [];
    activity.tasks.forEach(function (task, i) {
      if (!taskCharts.hasOwnProperty(task.task)) {
        taskChartsMade += 1;
        taskCharts[task.task] = "task-chart-" + taskChartsMade;
      }
      var id = taskCharts[task.task];
      kept[id] = true;
      var chart = document.getElementById(id);
      if (!chart) {
        var figure = document.createElement("figure");
        var caption = document.createElement("figcaption");
        var code = document.createElement("code");
        code.textContent = task.task;
        caption.appendChild(code);
        caption.appendChild(document.createTextNode(": attempts per minute"));
        chart = document.createElement("div");
        chart.id = id;
        chart.className = "chart task-chart";
        chart.setAttribute("data-task", task.task);
        figure.appendChild(caption);
        figure.appendChild(chart);
        box.appendChild(figure);
      }
      if (box.children[i] !== chart.parentNode) {
        box.insertBefore(chart.parentNode, box.children[i]);
      }
      drawn.push([id, task]);
    });
    Array.prototype.slice.call(box.querySelectorAll(".task-chart")).forEach(function (chart) {
      if (!kept[chart.id]) {
        delete taskCharts[chart.getAttribute("data-task")];
        if (charts[chart.id]) {
          charts[chart.id].destroy();
          delete charts[chart.id];
        }
        box.removeChild(chart.parentNode);
      }
    });
    // Drawn once every figure is in place: a chart takes its box's width when drawn, and
    // a first figure alone would take the whole row the next ones share.
    drawn.forEach(function (pair) { draw(pair[0], pair[1], activity.minutes); });
  }

  function refreshTasks() {
    if (!document.getElementById("task-charts")) {
      return;
    }
    poll("/ui/api/tasks", drawTasks);
  }

  // A chart is drawn at its box's width: when the window's changes, so do the charts'.
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) {
      var element = document.getElementById(id);
      if (element) {
        charts[id].plot.setSize({ width: Math.max(element.clientWidth, 300), height: 220 });
      }
    });
  });

  refresh();
  setInterval(refresh, 5000);
  refreshTasks();
  setInterval(refreshTasks, 5000);

  // A fragment refused for want of a session: back to the sign-in page.
  document.body.addEventListener("htmx:responseError", function (event) {
    if (event.detail.xhr.status === 401) {
      window.location = "/ui/login";
    }
  });
})();
