// Charts for the ffdl dashboard, drawn with uPlot (vendored: uplot-1.6.32.min.js, MIT).
// A job's metric curves (one chart per emetrics group, one series per metric), its GPU
// utilisation and throughput over time, and the cluster's GPUs and queue over time.
// What each chart draws is kept in plain arrays and exposed as window.ffdlChartData, so
// that what the page shows can be read back and checked.
"use strict";

window.FfdlCharts = (() => {
  // Progress fields the SDK reports beside the metrics (ffdl.core.progress.PROGRESS_KEYS):
  // they are not learning curves.
  const PROGRESS_KEYS = new Set(["samples", "total_steps", "total_samples", "epoch", "total_epochs"]);
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];
  const HEIGHT = 190;
  const THROUGHPUT_WINDOW_S = 2;

  const exposed = { groups: {}, gpu: null, throughput: null, cluster: null, queue: null };
  window.ffdlChartData = exposed;

  function widthOf(container) {
    return Math.max((container.clientWidth || 480) - 8, 280);
  }

  function lineChart(container, title, xLabel, names, columns, { time = false, yRange } = {}) {
    const options = {
      title,
      width: widthOf(container),
      height: HEIGHT,
      scales: { x: { time }, ...(yRange ? { y: { range: yRange } } : {}) },
      series: [
        { label: xLabel },
        ...names.map((name, i) => ({
          label: name,
          stroke: COLORS[i % COLORS.length],
          width: 1.5,
          spanGaps: true,
        })),
      ],
      axes: [{}, { size: 56 }],
      legend: { live: true },
    };
    return new window.uPlot(options, columns, container);
  }

  // -- one job's metric curves ----------------------------------------------------------------

  class MetricCharts {
    constructor(container) {
      this.container = container;
      this.groups = new Map(); // group -> { x, names, values: Map(name -> []), chart, box }
      this.seen = new Set(); // rindex of each record drawn (the stream may resend a few)
      this.samples = []; // [seconds, cumulative samples] from learner 1's records
    }

    reset() {
      for (const group of this.groups.values()) if (group.chart) group.chart.destroy();
      this.groups.clear();
      this.seen.clear();
      this.samples = [];
      this.container.replaceChildren();
      exposed.groups = {};
      exposed.throughput = null;
    }

    // One record as the API gives it (FfDL's emetrics shape); false if already drawn.
    add(record) {
      const rindex = record.meta ? record.meta.rindex : undefined;
      if (rindex !== undefined) {
        if (this.seen.has(rindex)) return false;
        this.seen.add(rindex);
      }
      const label = record.grouplabel || "train";
      let group = this.groups.get(label);
      if (!group) {
        const box = document.createElement("div");
        box.className = "chart";
        box.dataset.group = label;
        this.container.append(box);
        group = { x: [], names: [], values: new Map(), chart: null, box, dirty: true };
        this.groups.set(label, group);
      }
      const etimes = record.etimes || {};
      const iteration = etimes.iteration ? Number(etimes.iteration.value) : group.x.length;
      const values = {};
      for (const [name, raw] of Object.entries(record.values || {})) {
        const number = Number(raw && raw.value !== undefined ? raw.value : raw);
        if (!Number.isFinite(number)) continue;
        if (name === "samples" && etimes.time && (!record.meta || record.meta.learner === 1)) {
          this.samples.push([Number(etimes.time.value) / 1000, number]);
        }
        if (!PROGRESS_KEYS.has(name)) values[name] = number;
      }
      if (Object.keys(values).length === 0) return false;
      for (const name of Object.keys(values)) {
        if (!group.values.has(name)) {
          group.values.set(name, group.x.map(() => null));
          group.names.push(name);
          group.dirty = true;
        }
      }
      group.x.push(iteration);
      for (const name of group.names) group.values.get(name).push(values[name] ?? null);
      return true;
    }

    draw() {
      for (const [label, group] of this.groups) {
        const columns = [group.x, ...group.names.map((name) => group.values.get(name))];
        if (group.dirty || !group.chart) {
          if (group.chart) group.chart.destroy();
          group.box.replaceChildren();
          group.chart = lineChart(group.box, `${label}`, "iteration", group.names, columns);
          group.dirty = false;
        } else {
          group.chart.setData(columns);
        }
        exposed.groups[label] = {
          x: [...group.x],
          series: Object.fromEntries(group.names.map((n) => [n, [...group.values.get(n)]])),
        };
      }
    }

    // Samples per second from learner 1's reports, over windows of at least
    // THROUGHPUT_WINDOW_S (reports a fraction of a second apart would chart their jitter).
    throughput() {
      const times = [];
      const rates = [];
      const points = [...this.samples].sort((a, b) => a[0] - b[0]);
      let anchor = points[0];
      for (const point of points.slice(1)) {
        const dt = point[0] - anchor[0];
        const ds = point[1] - anchor[1];
        if (ds < 0) {
          anchor = point; // a new attempt counting from its checkpoint
        } else if (dt >= THROUGHPUT_WINDOW_S) {
          times.push(point[0]);
          rates.push(ds / dt);
          anchor = point;
        }
      }
      return [times, rates];
    }
  }

  // -- a job's GPUs and throughput over time ----------------------------------------------------

  function drawTimeSeries(holder, key, container, title, names, columns, yRange) {
    if (holder[key]) holder[key].destroy();
    container.replaceChildren();
    holder[key] = null;
    if (columns[0].length === 0) {
      container.append(Object.assign(document.createElement("p"), { className: "empty", textContent: `${title}: no data yet.` }));
      return;
    }
    holder[key] = lineChart(container, title, "time", names, columns, { time: true, yRange });
  }

  class JobResourceCharts {
    constructor(gpuBox, throughputBox) {
      this.gpuBox = gpuBox;
      this.throughputBox = throughputBox;
      this.charts = {};
    }

    reset() {
      for (const chart of Object.values(this.charts)) if (chart) chart.destroy();
      this.charts = {};
      this.gpuBox.replaceChildren();
      this.throughputBox.replaceChildren();
      exposed.gpu = null;
    }

    // body: GET /v1/models/{id}/gpu. One series per learner: its GPUs' mean utilisation.
    drawGpu(body) {
      const samples = (body && body.samples) || [];
      const learners = [...new Set(samples.map((s) => s.learner))].sort((a, b) => a - b);
      const times = [...new Set(samples.map((s) => s.time))].sort((a, b) => a - b);
      const index = new Map(times.map((t, i) => [t, i]));
      const columns = [times, ...learners.map(() => times.map(() => null))];
      for (const sample of samples) {
        columns[1 + learners.indexOf(sample.learner)][index.get(sample.time)] = sample.util;
      }
      exposed.gpu = {
        time: times,
        util: Object.fromEntries(learners.map((l, i) => [`learner ${l}`, columns[1 + i]])),
        average: body ? body.average_util : null,
      };
      drawTimeSeries(this.charts, "gpu", this.gpuBox, "GPU utilisation (%)",
        learners.map((l) => `learner ${l}`), columns, [0, 100]);
    }

    drawThroughput([times, rates]) {
      exposed.throughput = { time: [...times], samples_per_s: [...rates] };
      drawTimeSeries(this.charts, "throughput", this.throughputBox, "Throughput (samples/s)",
        ["samples/s"], [times, rates]);
    }
  }

  // -- the cluster over time ----------------------------------------------------------------------

  class ClusterCharts {
    constructor(gpuBox, queueBox) {
      this.gpuBox = gpuBox;
      this.queueBox = queueBox;
      this.samples = [];
      this.charts = {};
    }

    last() {
      return this.samples.length ? this.samples[this.samples.length - 1].time : null;
    }

    add(samples) {
      const last = this.last();
      for (const sample of samples) if (last === null || sample.time > last) this.samples.push(sample);
    }

    draw() {
      const time = this.samples.map((s) => s.time);
      const pick = (name) => this.samples.map((s) => s[name]);
      exposed.cluster = {
        time,
        gpus_total: pick("gpus_total"),
        gpus_allocated: pick("gpus_allocated"),
        gpus_busy: pick("gpus_busy"),
        queue_length: pick("queue_length"),
      };
      drawTimeSeries(this.charts, "gpus", this.gpuBox, "Cluster GPUs",
        ["total", "allocated", "busy"],
        [time, pick("gpus_total"), pick("gpus_allocated"), pick("gpus_busy")]);
      drawTimeSeries(this.charts, "queue", this.queueBox, "Queue length",
        ["queued jobs", "running jobs"], [time, pick("queue_length"), pick("running")]);
    }
  }

  return { MetricCharts, JobResourceCharts, ClusterCharts, PROGRESS_KEYS };
})();
