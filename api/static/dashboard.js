/* repack dashboard: plots over a job's steps and the layout grid of one step. */
"use strict";
const Repack = (() => {
  const plotConfig = { displaylogo: false, responsive: true };
  const base = (title, ytitle, steps) => ({
    title: { text: title, font: { size: 14 } },
    margin: { l: 56, r: 16, t: 40, b: 40 },
    // Steps are integers: never let plotly put ticks between them.
    xaxis: { title: { text: "step" }, tickformat: "d", dtick: Math.max(1, Math.ceil(steps / 10)) },
    yaxis: { title: { text: ytitle } },
    legend: { orientation: "h", y: 1.12, x: 1, xanchor: "right" },
  });
  const line = (steps, y, name, color) => ({
    x: steps.map((s) => s.step), y, name, mode: "lines+markers", type: "scatter",
    line: { color }, marker: { size: 5 }, customdata: steps.map((s) => s.plan_id),
  });

  function openOnClick(id) {
    document.getElementById(id).on("plotly_click", (ev) => {
      const planId = ev.points[0] && ev.points[0].customdata;
      if (planId) window.location.href = "/dashboard/plans/" + encodeURIComponent(planId);
    });
  }

  function jobPage(steps) {
    const m = (k) => steps.map((s) => s.metrics[k]);
    const plots = [
      ["plot-step-time", "Predicted step time", "ms",
        [line(steps, m("baseline_step_time_ms"), "baseline", "#9aa3b5"),
         line(steps, m("step_time_ms"), "plan", "#2f6fde")]],
      ["plot-speedup", "Speed-up over baseline", "×", [line(steps, m("speedup"), "speed-up", "#1a9e6a")]],
      ["plot-mfu", "MFU", "fraction of peak",
        [line(steps, m("baseline_mfu"), "baseline", "#9aa3b5"), line(steps, m("mfu"), "plan", "#8a4fd8")]],
      ["plot-gap", "Gap to lower bound", "fraction", [line(steps, m("gap"), "gap", "#d9822b")]],
      ["plot-solve", "Solve latency", "ms", [line(steps, m("solve_ms"), "solve", "#c23b4e")]],
    ];
    for (const [id, title, ytitle, traces] of plots) {
      Plotly.newPlot(id, traces, base(title, ytitle, steps.length), plotConfig);
      openOnClick(id);
    }
    const counts = {};
    for (const s of steps) {
      const key = s.status + " / " + (s.metrics.stopped_by || "?");
      counts[key] = (counts[key] || 0) + 1;
    }
    const mix = base("Status mix (status / stopped by)", "plans", steps.length);
    mix.xaxis = { title: { text: "" } };
    Plotly.newPlot("plot-status", [{
      type: "bar", x: Object.keys(counts), y: Object.values(counts), marker: { color: "#2f6fde" },
    }], mix, plotConfig);
  }

  const colour = (i) => `hsl(${(i * 137.508) % 360}, 62%, 48%)`;
  const fmtTokens = (n) => (n >= 1000 ? (n / 1000).toFixed(1) + "k" : String(n));

  function place(el, node, startCol, cols, rows) {
    el.style.gridRow = `${node + 1} / span ${rows}`;
    el.style.gridColumn = `${startCol + 2} / span ${cols}`;
  }

  function showDetails(panel, child, lengths) {
    const total = child.samples.reduce((a, s) => a + lengths[s], 0);
    const rows = child.samples.map((s) => `<tr><td>#${s}</td><td>${lengths[s]} tokens</td></tr>`);
    panel.innerHTML = `<b>child ${child.id}</b> of parent ${child.parent} · node ${child.node}` +
      ` · ranks ${child.ranks[0]}–${child.ranks[1] - 1} (SP ${child.ranks[1] - child.ranks[0]})` +
      `<br>${child.samples.length} samples · ${total} tokens<table>${rows.join("")}</table>`;
  }

  function planPage(data) {
    const { plan, lengths, nodes, gpus_per_node: G } = data;
    const grid = document.getElementById("layout");
    const panel = document.getElementById("details");
    grid.style.gridTemplateColumns = `64px repeat(${G}, minmax(28px, 1fr))`;
    for (let n = 0; n < nodes; n++) {
      const label = document.createElement("div");
      label.className = "node-label";
      label.style.gridRow = String(n + 1);
      label.textContent = "node " + n;
      grid.appendChild(label);
      for (let g = 0; g < G; g++) {
        const cell = document.createElement("div");
        cell.className = "gpu";
        place(cell, n, g, 1, 1);
        cell.textContent = String(n * G + g);
        grid.appendChild(cell);
      }
    }
    for (const child of plan.children) {
      const [start, end] = child.ranks;
      const el = document.createElement("div");
      el.className = "child" + (child.samples.length ? "" : " empty");
      place(el, child.node, start % G, end - start, 1);
      el.style.background = colour(child.id);
      const tokens = child.samples.reduce((a, s) => a + lengths[s], 0);
      el.textContent = child.samples.length
        ? `SP${end - start} · ${child.samples.length} smp\n${fmtTokens(tokens)} tok` : "idle";
      el.title = child.samples.map((s) => `#${s}: ${lengths[s]}`).join("\n") || "no samples";
      el.addEventListener("mouseenter", () => showDetails(panel, child, lengths));
      grid.appendChild(el);
    }
    for (const parent of plan.parents) {
      const [start, end] = parent.ranks;
      const size = end - start;
      const el = document.createElement("div");
      el.className = "parent";
      const node = Math.floor(start / G);
      if (size >= G) place(el, node, 0, G, size / G);
      else place(el, node, start % G, size, 1);
      el.title = `parent ${parent.id}: ${parent.samples.length} samples`;
      grid.appendChild(el);
    }
    const first = plan.children.find((c) => c.samples.length);
    if (first) showDetails(panel, first, lengths);
  }

  return { jobPage, planPage };
})();
