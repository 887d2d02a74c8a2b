/* repack dashboard: predicted vs measured step times of one job, and its refitted profiles. */
"use strict";
const RepackMeasured = (() => {
  const config = { displaylogo: false, responsive: true };
  const TERMS = [["compute", "#2f6fde"], ["intra", "#1a9e6a"], ["inter", "#d9822b"], ["latency", "#8a4fd8"], ["peer_latency", "#c04f8a"], ["overhead", "#888888"]];
  const layout = (title, xtitle, ytitle) => ({
    title: { text: title, font: { size: 14 } },
    margin: { l: 56, r: 16, t: 40, b: 40 },
    xaxis: { title: { text: xtitle } },
    yaxis: { title: { text: ytitle } },
    legend: { orientation: "h", y: 1.12, x: 1, xanchor: "right" },
  });

  function page(data) {
    const steps = data.steps;
    const x = steps.map((s) => s.step);
    Plotly.newPlot("plot-predicted-measured", [
      { x, y: steps.map((s) => s.measured_ms), name: "measured", mode: "lines+markers", line: { color: "#c23b4e" } },
      { x, y: steps.map((s) => s.predicted_ms), name: "predicted", mode: "lines+markers", line: { color: "#2f6fde" } },
    ], layout("Step time: predicted vs measured", "step", "ms"), config);

    const errors = steps.filter((s) => s.error !== null).map((s) => 100 * s.error);
    Plotly.newPlot("plot-error-hist", [
      { x: errors, type: "histogram", nbinsx: 20, marker: { color: "#2f6fde" }, name: "steps" },
    ], layout("Error (predicted − measured) / measured", "%", "steps"), config);

    const priced = steps.filter((s) => s.terms_ms !== null);
    const terms = TERMS.map(([term, color]) => ({
      x: priced.map((s) => s.step), y: priced.map((s) => s.terms_ms[term]), name: term,
      type: "bar", marker: { color },
      customdata: priced.map((s) => s.dominating),
      hovertemplate: "step %{x}: %{y:.3g} ms (dominating: %{customdata})<extra>" + term + "</extra>",
    }));
    const stacked = layout("Predicted time by term (dominating term on hover)", "step", "ms");
    stacked.barmode = "stack";
    Plotly.newPlot("plot-terms", terms, stacked, config);

    const versions = data.feedback.versions;
    const first = versions.length ? versions[0].constants : {};
    // A constant that is 0 in version 1 (no per-layer overhead) has no ratio to plot.
    const names = Object.keys(first).filter((name) => first[name] !== 0).sort();
    const lines = names.map((name) => ({
      x: versions.map((v) => v.from_step), y: versions.map((v) => v.constants[name] / first[name]),
      name, mode: "lines+markers", type: "scatter",
      customdata: versions.map((v) => v.constants[name]),
      hovertemplate: name + " = %{customdata:.4g} (x%{y:.3f} of version 1)<extra></extra>",
    }));
    const constants = layout("Fitted profile constants (relative to version 1)", "first step planned with it", "× version 1");
    constants.legend = { orientation: "h", y: -0.3, x: 0 };
    constants.margin.b = 96;
    Plotly.newPlot("plot-constants", lines, constants, config);
  }

  return { page };
})();
