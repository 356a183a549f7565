// parplan report: the page's script. Reads the JSON in #report-data (solver.sweep.report_data),
// draws the problem table (sortable, filterable), the selected problem's ranked plans with their
// launch lines, memory and step-time charts, and its group's Pareto fronts. Charts use Plotly
// when the page embeds it (as text in #chart-library, run after the table is drawn, so the
// table answers at once); without it the page keeps its tables.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var problems = data.problems;
  var library = document.getElementById("chart-library");
  var charts = false;  // Plotly is running (after startCharts)
  var chartsNote = library ? "charts are loading" : data.charts_missing;
  var SOLVED = { optimal: true, feasible: true };
  // Every series of the step-time chart by its name (solver.sweep.report_data.TIME_WORDS).
  var TIME_WORDS = data.time_words;
  var PLOT_CONFIG = { displaylogo: false, responsive: true };

  // Numbers to three significant figures, thousands separated (solver.spec.figures).
  function fmt(value) {
    if (value === null || value === undefined || value === "") return "";
    if (!isFinite(value)) return String(value);
    if (value === 0) return "0";
    var rounded = Number(value.toPrecision(3));
    var decimals = Math.max(0, 2 - Math.floor(Math.log10(Math.abs(rounded))));
    var shown = decimals === 0 ? Math.round(value) : rounded;
    return shown.toLocaleString("en-US", { minimumFractionDigits: decimals,
      maximumFractionDigits: decimals, useGrouping: Math.abs(shown) >= 1e4 });
  }

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      if (name === "text") node.textContent = attrs[name];
      else if (name === "className") node.className = attrs[name];
      else node.setAttribute(name, attrs[name]);
    });
    (children || []).forEach(function (child) {
      node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
    });
    return node;
  }

  function best(problem) { return problem.plans.length ? problem.plans[0] : null; }
  function fromBest(pick) {
    return function (problem) { var plan = best(problem); return plan ? pick(plan) : null; };
  }

  var COLUMNS = [
    { key: "model", label: "model" },
    { key: "cluster", label: "cluster" },
    { key: "gpus", label: "GPUs", num: true, count: true },
    { key: "seq_len", label: "seq len", num: true, count: true },
    { key: "global_batch", label: "global batch", num: true, count: true },
    { key: "precision", label: "precision" },
    { key: "framework", label: "framework" },
    { key: "objective", label: "objective" },
    { key: "status", label: "status" },
    { key: "config", label: "best plan", get: function (p) {
      var plan = best(p);
      if (plan) return plan.config;
      return p.status === "error" ? p.error : "conflicts: " + p.conflicts.join(", ");
    } },
    { key: "memory", label: "GB per GPU", num: true, get: fromBest(function (q) { return q.memory.total; }) },
    { key: "memory_percent", label: "% of GPU memory", num: true, get: fromBest(function (q) { return q.memory_percent; }) },
    { key: "step", label: "step s", num: true, get: fromBest(function (q) { return q.step; }) },
    { key: "rate", label: "tokens/s", num: true, get: fromBest(function (q) { return q.rate; }) },
    { key: "mfu", label: "MFU %", num: true, get: fromBest(function (q) { return 100 * q.mfu; }) },
    { key: "days", label: "days", num: true, get: fromBest(function (q) { return q.days; }) },
    { key: "gpu_hours", label: "GPU-hours", num: true, get: fromBest(function (q) { return q.gpu_hours; }) }
  ].filter(function (column) { return data.constant[column.key] === undefined; });

  function value(problem, column) {
    return column.get ? column.get(problem) : problem[column.key];
  }

  // ---- the problem table ----
  var table = document.getElementById("problems");
  var tbody = table.querySelector("tbody");
  var rows = [];
  var headRow = table.querySelector("thead tr");
  COLUMNS.forEach(function (column, c) {
    var th = el("th", { scope: "col", tabindex: "0", "data-key": column.key,
      className: column.num ? "num" : "" }, [column.label]);
    th.addEventListener("click", function () { sortBy(c); });
    th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortBy(c); });
    headRow.appendChild(th);
  });
  var fragment = document.createDocumentFragment();
  problems.forEach(function (problem, index) {
    var tr = el("tr", { tabindex: "0", "data-index": String(index),
      className: "status-" + problem.status });
    COLUMNS.forEach(function (column) {
      var v = value(problem, column);
      var text = column.num && !column.count ? fmt(v) : (v === null || v === undefined ? "" : String(v));
      var td = el("td", { className: column.num ? "num" : "" }, [text]);
      if (column.key === "memory" && v !== null) td.title = "of " + fmt(problem.usable_memory_gb) + " GB usable";
      if (column.key === "config") td.className = "config";
      tr.appendChild(td);
    });
    tr.addEventListener("click", function () { select(index); });
    tr.addEventListener("keydown", function (e) { if (e.key === "Enter") select(index); });
    fragment.appendChild(tr);
    rows.push(tr);
  });
  tbody.appendChild(fragment);
  var rowText = rows.map(function (tr) { return tr.textContent.toLowerCase(); });

  var sortState = { column: -1, ascending: true };
  function sortBy(c) {
    sortState.ascending = sortState.column === c ? !sortState.ascending : true;
    sortState.column = c;
    var column = COLUMNS[c];
    var sign = sortState.ascending ? 1 : -1;
    var keys = problems.map(function (problem) { return value(problem, column); });
    var order = problems.map(function (_, i) { return i; });
    order.sort(function (a, b) {
      var x = keys[a], y = keys[b];
      var xm = x === null || x === undefined || x === "", ym = y === null || y === undefined || y === "";
      if (xm || ym) return xm === ym ? a - b : (xm ? 1 : -1);  // missing values last
      if (x < y) return -sign;
      if (x > y) return sign;
      return a - b;
    });
    var sorted = document.createDocumentFragment();
    order.forEach(function (i) { sorted.appendChild(rows[i]); });
    tbody.appendChild(sorted);
    headRow.querySelectorAll("th").forEach(function (th, i) {
      th.setAttribute("aria-sort", i === c ? (sortState.ascending ? "ascending" : "descending") : "none");
    });
  }

  // ---- filters ----
  var filters = { text: document.getElementById("filter-text") };
  ["model", "cluster", "gpus", "status"].forEach(function (key) {
    var select = document.getElementById("filter-" + key);
    var seen = {};
    problems.forEach(function (p) { seen[p[key]] = true; });
    Object.keys(seen).sort(function (a, b) {
      return key === "gpus" ? Number(a) - Number(b) : a.localeCompare(b);
    }).forEach(function (option) { select.appendChild(el("option", { value: option }, [option])); });
    select.addEventListener("change", applyFilters);
    filters[key] = select;
  });
  filters.text.addEventListener("input", applyFilters);

  function applyFilters() {
    var words = filters.text.value.toLowerCase().split(/\s+/).filter(Boolean);
    var shown = 0;
    problems.forEach(function (problem, i) {
      var keep = ["model", "cluster", "gpus", "status"].every(function (key) {
        var wanted = filters[key].value;
        return wanted === "" || String(problem[key]) === wanted;
      });
      if (keep && words.length) {
        keep = words.every(function (word) { return rowText[i].indexOf(word) >= 0; });
      }
      rows[i].hidden = !keep;
      if (keep) shown += 1;
    });
    document.getElementById("row-count").textContent =
      shown + " of " + problems.length + " problems shown";
  }

  // ---- the selected problem ----
  var selected = -1;
  function select(index) {
    if (selected >= 0) rows[selected].classList.remove("selected");
    selected = index;
    rows[index].classList.add("selected");
    if (window.location.hash !== "#problem-" + index) {
      window.history.replaceState(null, "", "#problem-" + index);
    }
    renderDetails(problems[index], index);
  }

  function copyText(text, button) {
    function done(ok) {
      button.textContent = ok ? "copied" : "select and copy";
      setTimeout(function () { button.textContent = "copy"; }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(fallback()); });
    } else {
      done(fallback());
    }
    function fallback() {
      var area = el("textarea", {}, []);
      area.value = text;
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      document.body.removeChild(area);
      return ok;
    }
  }

  function renderDetails(problem, index) {
    var box = document.getElementById("details");
    box.hidden = false;
    box.replaceChildren();
    box.appendChild(el("h2", { id: "details-title" }, [problem.model + " on " + problem.cluster +
      ", " + problem.gpus + " GPUs"]));
    box.appendChild(el("p", { className: "job" }, ["seq len " + problem.seq_len + ", global batch " +
      problem.global_batch + ", " + problem.precision + ", " + problem.framework + ", objective " +
      problem.objective + (problem.headroom ? ", memory headroom " + problem.headroom : "")]));
    if (problem.memory_rule) box.appendChild(el("p", { className: "job" }, ["memory: " + problem.memory_rule]));
    var status = el("p", { className: "status status-" + problem.status }, ["status: " + problem.status]);
    box.appendChild(status);
    if (problem.status === "error") {
      box.appendChild(el("p", { className: "error" }, [problem.error]));
    }
    if (problem.status === "infeasible") {
      box.appendChild(el("h3", {}, ["Why nothing fits"]));
      box.appendChild(el("ul", {}, problem.conflicts.map(function (name) {
        return el("li", {}, [el("code", {}, [name]), ": " + (problem.rules[name] || "")]);
      })));
      if (problem.fixes.length) {
        box.appendChild(el("h3", {}, ["What would fix it"]));
        box.appendChild(el("ul", {}, problem.fixes.map(function (fix) { return el("li", {}, [fix]); })));
      }
    }
    if (problem.plans.length) renderPlans(box, problem);
    if (problem.why.length) {
      box.appendChild(el("h3", {}, ["Why the best plan"]));
      box.appendChild(el("ol", { className: "why" }, problem.why.map(function (line) {
        return el("li", {}, [line.replace(/^\d+\.\s*/, "")]);
      })));
    }
    renderFronts(box, problem, index);
  }

  function renderPlans(box, problem) {
    box.appendChild(el("h3", {}, ["Ranked plans"]));
    var first = problem.plans[0];
    var head = ["#", "plan", "step s", "vs best", "tokens/s", "MFU %", "GB per GPU (% of GPU memory)",
      "days", "GPU-hours", "launch", ""].map(function (h) { return el("th", {}, [h]); });
    var body = el("tbody", {}, []);
    problem.plans.forEach(function (plan, rank) {
      var gap = rank === 0 ? "best" : "+" + fmt(100 * (plan.step - first.step) / first.step) + "%";
      var copy = el("button", { type: "button", className: "copy" }, ["copy"]);
      copy.addEventListener("click", function (e) { e.stopPropagation(); copyText(plan.launch, copy); });
      var more = el("button", { type: "button", className: "more", "aria-expanded": "false" }, ["details"]);
      var tr = el("tr", { className: "plan" }, [
        el("td", {}, [String(rank + 1)]),
        el("td", { className: "config" }, [plan.config +
          (plan.twins ? " (same step time with " + plan.twins + ")" : "")]),
        el("td", { className: "num" }, [fmt(plan.step)]),
        el("td", { className: "num" }, [gap]),
        el("td", { className: "num" }, [fmt(plan.rate)]),
        el("td", { className: "num" }, [fmt(100 * plan.mfu)]),
        el("td", { className: "num" }, [fmt(plan.memory.total) + " of " + fmt(problem.usable_memory_gb) +
          (plan.memory_percent === null ? "" : " (" + fmt(plan.memory_percent) + "%)")]),
        el("td", { className: "num" }, [fmt(plan.days)]),
        el("td", { className: "num" }, [fmt(plan.gpu_hours)]),
        el("td", { className: "launch" }, [launchCode(plan.launch), copy]),
        el("td", {}, [more])
      ]);
      var extra = el("tr", { className: "plan-details", hidden: "" }, [
        el("td", { colspan: "11" }, [planDetails(plan)])]);
      more.addEventListener("click", function () {
        extra.hidden = !extra.hidden;
        more.setAttribute("aria-expanded", String(!extra.hidden));
      });
      body.appendChild(tr);
      body.appendChild(extra);
    });
    box.appendChild(el("table", { className: "plans" }, [el("thead", {}, [el("tr", {}, head)]), body]));
    box.appendChild(el("p", { className: "note" }, ["Days and GPU-hours to train on " +
      data.token_budget_label + " tokens (parplan report --token-budget). The launch line writes " +
      "the plan's framework settings."]));
    var chartsBox = el("div", { className: "charts" }, []);
    box.appendChild(chartsBox);
    if (!charts) {
      chartsBox.appendChild(el("p", { className: "note" }, [chartsNote]));
      return;
    }
    var memoryDiv = el("div", { className: "chart", id: "chart-memory" }, []);
    var timeDiv = el("div", { className: "chart", id: "chart-time" }, []);
    chartsBox.appendChild(memoryDiv);
    chartsBox.appendChild(timeDiv);
    drawMemory(memoryDiv, problem);
    drawTime(timeDiv, problem);
  }

  // A launch line that wraps between words only: each word an unbreakable span (a browser
  // would also break after a word's hyphens, inside "--global-batch"), the spaces between.
  function launchCode(line) {
    var parts = [];
    line.split(" ").forEach(function (word, i) {
      if (i) parts.push(" ");
      parts.push(el("span", { className: "word" }, [word]));
    });
    return el("code", {}, parts);
  }

  function planDetails(plan) {
    var other = Object.keys(plan.memory_other).map(function (item) {
      return item + " " + fmt(plan.memory_other[item]);
    }).join(", ");
    var memory = data.memory_items.map(function (item) {
      return item + " " + fmt(plan.memory[item]) + " GB" + (item === "other" ? " (" + other + ")" : "");
    }).join(", ") + (plan.memory_percent === null ? "" : "; " + fmt(plan.memory_percent) + "% of GPU memory");
    var time = data.time_parts.filter(function (part) { return plan.time[part] > 0; })
      .map(function (part) { return TIME_WORDS[part] + " " + fmt(plan.time[part]) + " s"; }).join(", ");
    var views = Object.keys(data.memory_views).filter(function (view) {
      return plan.views[view] !== null;
    }).map(function (view) {
      return view + " " + fmt(plan.views[view]) + " GB (" + data.memory_views[view] + ")";
    }).join(", ");
    var observed = Object.keys(data.observed_views).filter(function (view) {
      return plan.views_observed[view] !== null;
    }).map(function (view) {
      return view + " " + fmt(plan.views_observed[view]) + " GB (" + data.observed_views[view] + ")";
    }).join(", ");
    var items = [
      el("dt", {}, ["memory (worst stage)"]), el("dd", {}, [memory]),
      el("dt", {}, ["memory views"]), el("dd", {}, [views]),
      el("dt", {}, ["views on this GPU"]), el("dd", {}, [observed || "not in this line"]),
      el("dt", {}, ["step time"]), el("dd", {}, [time]),
      el("dt", {}, ["tokens/s per GPU"]), el("dd", {}, [fmt(plan.rate_per_gpu)])
    ];
    // Issue 36 (absent from lines written before it).
    if (plan.step_interval) items.push(el("dt", {}, ["step time interval"]),
      el("dd", {}, [fmt(plan.step_interval[0]) + "-" + fmt(plan.step_interval[1]) + " s"]));
    if (plan.memory_interval) items.push(el("dt", {}, ["memory interval"]),
      el("dd", {}, [fmt(plan.memory_interval[0]) + "-" + fmt(plan.memory_interval[1]) + " GB"]));
    if (plan.fit_probability !== null && plan.fit_probability !== undefined) {
      items.push(el("dt", {}, ["chance it fits"]), el("dd", {}, [Math.round(100 * plan.fit_probability) + "%"]));
    }
    if (plan.p_fastest !== null && plan.p_fastest !== undefined) {
      items.push(el("dt", {}, ["chance it is the fastest listed"]), el("dd", {}, [Math.round(100 * plan.p_fastest) + "%"]));
    }
    if (plan.layout) items.push(el("dt", {}, ["pipeline layout"]), el("dd", {}, [el("code", {}, [plan.layout])]));
    if (plan.twins) items.push(el("dt", {}, ["same step time with"]), el("dd", {}, [plan.twins]));
    return el("dl", {}, items);
  }

  function planLabels(problem) {
    return problem.plans.map(function (_, rank) { return "#" + (rank + 1); });
  }

  // The items of "other" in any of the problem's plans (largest first in the first plan).
  function otherItems(problem) {
    var names = [];
    problem.plans.forEach(function (plan) {
      Object.keys(plan.memory_other).forEach(function (name) {
        if (names.indexOf(name) < 0) names.push(name);
      });
    });
    return names;
  }

  function drawMemory(div, problem) {
    var labels = planLabels(problem);
    var items = data.memory_items.filter(function (item) { return item !== "other"; });
    var traces = items.map(function (item) {
      return { type: "bar", name: item, x: labels,
        y: problem.plans.map(function (plan) { return plan.memory[item]; }),
        hovertemplate: "%{x} " + item + ": %{y:.3g} GB<extra></extra>" };
    }).concat(otherItems(problem).map(function (name) {
      var label = name === "other" ? "other" : "other: " + name;
      return { type: "bar", name: plotText(label), x: labels,
        y: problem.plans.map(function (plan) { return plan.memory_other[name] || 0; }),
        hovertemplate: "%{x} " + plotText(label) + ": %{y:.3g} GB<extra></extra>" };
    }));
    // Each plan's share of the GPU's memory above its bar.
    traces.push({ type: "scatter", mode: "text", name: "% of GPU memory", x: labels,
      y: problem.plans.map(function (plan) { return plan.memory.total; }),
      text: problem.plans.map(function (plan) {
        return plan.memory_percent === null ? "" : fmt(plan.memory_percent) + "%";
      }),
      textposition: "top center", hoverinfo: "skip", showlegend: false });
    var lines = [{ y: problem.gpu_memory_gb, text: "GPU memory " + fmt(problem.gpu_memory_gb) + " GB", dash: "solid" }];
    if (problem.usable_memory_gb !== problem.gpu_memory_gb) {
      lines.push({ y: problem.usable_memory_gb, text: "usable " + fmt(problem.usable_memory_gb) + " GB", dash: "dash" });
    }
    window.Plotly.newPlot(div, traces, {
      title: { text: "Memory per GPU (worst stage) against capacity" }, barmode: "stack",
      xaxis: { type: "category" }, yaxis: { title: { text: "GB" }, rangemode: "tozero" },
      height: 360, margin: { t: 50, r: 10, b: 40, l: 60 }, legend: { orientation: "h", y: -0.15 },
      shapes: lines.map(function (line) {
        return { type: "line", xref: "paper", x0: 0, x1: 1, y0: line.y, y1: line.y,
          line: { color: "#b00", dash: line.dash, width: 2 } };
      }),
      annotations: lines.map(function (line) {
        return { xref: "paper", x: 1, y: line.y, text: line.text, showarrow: false,
          xanchor: "right", yanchor: "bottom", font: { color: "#b00", size: 11 } };
      })
    }, PLOT_CONFIG);
  }

  function drawTime(div, problem) {
    var labels = planLabels(problem);
    var traces = data.time_parts.filter(function (part) {
      return problem.plans.some(function (plan) { return plan.time[part] > 0; });
    }).map(function (part) {
      return { type: "bar", orientation: "h", name: TIME_WORDS[part], y: labels,
        x: problem.plans.map(function (plan) { return plan.time[part]; }),
        hovertemplate: "%{y} " + TIME_WORDS[part] + ": %{x:.3g} s<extra></extra>" };
    });
    window.Plotly.newPlot(div, traces, {
      title: { text: "Step time by part (exposed)" }, barmode: "stack", height: 360,
      xaxis: { title: { text: "seconds per step" }, rangemode: "tozero" },
      yaxis: { autorange: "reversed", type: "category" },
      margin: { t: 50, r: 10, b: 40, l: 50 }, legend: { orientation: "h", y: -0.25 }
    }, PLOT_CONFIG);
  }

  // ---- Pareto fronts ----
  function renderFronts(box, problem, index) {
    var mine = data.fronts.filter(function (front) { return front.group === problem.group; });
    if (!mine.length) return;
    box.appendChild(el("h3", {}, ["Pareto fronts: " + data.groups[problem.group]]));
    box.appendChild(el("p", { className: "note" }, ["Each point is the best plan of one cluster " +
      "at one GPU count; the line joins the points no other point beats on both axes. " +
      "Click a point to open its problem."]));
    if (!charts) { box.appendChild(el("p", { className: "note" }, [chartsNote])); return; }
    var row = el("div", { className: "charts" }, []);
    box.appendChild(row);
    // Every chart is in place before the first is drawn, so each is sized to its own share.
    var divs = mine.map(function (front, f) {
      return row.appendChild(el("div", { className: "chart front", id: "front-" + f }, []));
    });
    mine.forEach(function (front, f) { drawFront(divs[f], front, index); });
  }

  // An axis as the front states it (report_fronts.render_axis: linear from zero, or log and
  // saying so); a log axis labelled at its few integer values (GPU counts), else at 1, 2 and 5
  // per decade.
  function axis(stated, values) {
    var log = stated.type === "log";
    var spec = { title: { text: plotText(stated.title) }, type: stated.type, tickformat: "~s" };
    if (stated.rangemode) spec.rangemode = stated.rangemode;
    if (!log) return spec;
    var distinct = values.filter(function (v, i) { return values.indexOf(v) === i; });
    if (distinct.length <= 12 && distinct.every(function (v) { return Number.isInteger(v); })) {
      spec.tickvals = distinct.sort(function (a, b) { return a - b; });
      spec.tickformat = "";
    } else {
      spec.dtick = "D2";
    }
    return spec;
  }

  // Plotly reads the strings it draws (trace names, hover text, titles) as HTML-like markup
  // (<a href>, <b>, <br>) and decodes entities: a name from the results file goes through
  // this, so that it shows as written (a cluster named <a href=...> was a live legend link).
  function plotText(value) {
    return String(value).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
  }

  function drawFront(div, front, index) {
    var series = {};
    front.points.forEach(function (point) {
      var s = series[point[0]] || (series[point[0]] = { x: [], y: [], text: [], customdata: [] });
      s.x.push(point[1]); s.y.push(point[2]); s.text.push(point[3]); s.customdata.push(point[4]);
    });
    var traces = Object.keys(series).map(function (name) {
      var s = series[name];
      return { type: "scatter", mode: "markers", name: plotText(name), x: s.x, y: s.y,
        text: s.text.map(plotText),
        customdata: s.customdata, marker: { size: 9 },
        hovertemplate: "%{text}<br>%{x:.3g}, %{y:.3g}<extra></extra>" };
    });
    var onFront = front.on_front.map(function (i) { return front.points[i]; });
    traces.push({ type: "scatter", mode: "lines", name: "Pareto front", hoverinfo: "skip",
      x: onFront.map(function (p) { return p[1]; }), y: onFront.map(function (p) { return p[2]; }),
      line: { color: "#333", dash: "dot", shape: "hv" } });
    var here = front.points.filter(function (p) { return p[4] === index; });
    if (here.length) {
      traces.push({ type: "scatter", mode: "markers", name: "this problem", hoverinfo: "skip",
        x: [here[0][1]], y: [here[0][2]],
        marker: { size: 18, color: "rgba(0,0,0,0)", line: { color: "#d00", width: 3 } } });
    }
    window.Plotly.newPlot(div, traces, {
      title: { text: plotText(front.title) }, height: 360, margin: { t: 50, r: 10, b: 50, l: 70 },
      xaxis: axis(front.x_axis, front.points.map(function (p) { return p[1]; })),
      yaxis: axis(front.y_axis, front.points.map(function (p) { return p[2]; })),
      legend: { orientation: "h", y: -0.25 }
    }, PLOT_CONFIG);
    div.on("plotly_click", function (event) {
      var target = event.points.length ? event.points[0].customdata : null;
      if (target !== null && target !== undefined) select(target);
    });
  }

  // Fronts of no group (given by another planner, e.g. serving): their own section, drawn once.
  function renderLooseFronts() {
    var loose = data.fronts.filter(function (front) { return !front.group; });
    if (!loose.length) return;
    var box = document.getElementById("fronts");
    box.hidden = false;
    box.replaceChildren(el("h2", {}, ["Pareto fronts"]));
    if (!charts) { box.appendChild(el("p", { className: "note" }, [chartsNote])); return; }
    var row = box.appendChild(el("div", { className: "charts" }, []));
    var divs = loose.map(function (front, f) {
      return row.appendChild(el("div", { className: "chart front", id: "loose-front-" + f }, []));
    });
    loose.forEach(function (front, f) { drawFront(divs[f], front, -1); });
  }

  // ---- start ----
  applyFilters();
  renderLooseFronts();
  var fromHash = /^#problem-(\d+)$/.exec(window.location.hash);
  var start = fromHash ? Number(fromHash[1]) : problems.findIndex(function (p) { return SOLVED[p.status]; });
  if (start >= 0 && start < problems.length) select(start);
  document.body.setAttribute("data-table-ready", "true");
  performance.mark("table-ready");

  // Plotly's bundle (megabytes) loads once the table has been painted, from a blob of the
  // page's own text (the browser compiles it off the main thread); then the charts.
  function drawCharts() {
    charts = typeof window.Plotly !== "undefined";
    chartsNote = data.charts_missing;
    renderLooseFronts();
    if (selected >= 0) renderDetails(problems[selected], selected);
    document.body.setAttribute("data-ready", "true");
    performance.mark("charts-ready");
  }
  function startCharts() {
    if (!library) { drawCharts(); return; }
    var script = document.createElement("script");
    script.src = URL.createObjectURL(new Blob([library.textContent], { type: "text/javascript" }));
    script.onload = function () { URL.revokeObjectURL(script.src); drawCharts(); };
    script.onerror = drawCharts;
    document.head.appendChild(script);
  }
  window.requestAnimationFrame(function () { setTimeout(startCharts, 0); });
})();
