// The ffdl dashboard: jobs, one job's detail (summary, charts, events, logs, metrics, the
// controls its status allows), the cluster over time, the queue and the nodes, all read
// from the JSON API with the user's bearer token; a job's new metric points arrive over
// its event stream (SSE). Charts are charts.js's.
// API data only ever reaches the page through textContent, never as markup.
"use strict";

(() => {
  const TOKEN_KEY = "ffdl.token";
  const REFRESH_MS = 2000;
  const LOG_LINES = 200;
  const METRIC_RECORDS = 50;
  const CHART_RECORDS = 5000; // the most recent points a job's charts start from
  const CLUSTER_REFRESH_MS = 10000;
  // Jobs in these states can still write logs and metrics, so their detail keeps refreshing.
  const LIVE_STATES = new Set([
    "QUEUED", "PENDING", "DOWNLOADING", "PROCESSING", "STORING", "HALTING", "RESCALING",
  ]);

  const state = {
    token: null,
    timer: null,
    generation: 0, // bumped on sign-in/out so replies from an older session are dropped
    selected: null, // job id shown in the detail pane
    selectedLive: true, // whether the selected job could still produce output at last look
    detailLoaded: false,
    follow: null, // the AbortController of the selected job's event stream
    clusterAt: 0, // when the cluster charts were last refreshed (ms)
    statusRefresh: null, // a pending refresh of the detail after stream status events
  };
  const charts = {
    metrics: null,
    resources: null,
    cluster: null,
  };

  const $ = (id) => document.getElementById(id);
  const { localTime, durationText, progressText, gpuText, startEstimateText } = window.FfdlFormat;

  class ApiError extends Error {
    constructor(status, message, code) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // -- DOM helpers ---------------------------------------------------------------------------

  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props)) {
      if (value === undefined || value === null) continue;
      if (key === "class") node.className = value;
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, String(value));
    }
    for (const child of children) {
      node.append(child instanceof Node ? child : String(child ?? ""));
    }
    return node;
  }

  function badge(status) {
    return el("span", { class: "badge", dataset: { status: status || "" } }, status || "?");
  }

  function setBadge(node, status) {
    node.dataset.status = status || "";
    node.textContent = status || "?";
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  function fillTable(table, rows, emptyNote) {
    const body = table.tBodies[0];
    const current = body.children;
    const same = current.length === rows.length && rows.every((row, i) => current[i] === row);
    // Re-inserting unchanged rows would drop keyboard focus from the one the reader is on.
    if (!same) body.replaceChildren(...rows);
    show(emptyNote, rows.length === 0);
  }

  // -- token ---------------------------------------------------------------------------------

  function tokenFromFragment() {
    const params = new URLSearchParams(window.location.hash.slice(1));
    const token = params.get("token");
    if (!token) return null;
    // The token must not linger in the address bar, history or a copied link.
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
    return token;
  }

  function storedToken() {
    try {
      return window.localStorage.getItem(TOKEN_KEY);
    } catch {
      return null;
    }
  }

  function storeToken(token) {
    try {
      if (token) window.localStorage.setItem(TOKEN_KEY, token);
      else window.localStorage.removeItem(TOKEN_KEY);
    } catch {
      // Storage can be disabled; the token then lasts only as long as the page.
    }
  }

  function askForToken(message) {
    stopRefreshing();
    state.token = null;
    storeToken(null);
    show($("dashboard"), false);
    show($("forget-token"), false);
    show($("token-panel"), true);
    const error = $("token-error");
    error.textContent = message || "";
    show(error, Boolean(message));
    setConnection("idle", "");
    $("token-input").value = "";
    $("token-input").focus();
  }

  function signIn(token) {
    state.token = token;
    storeToken(token);
    show($("token-panel"), false);
    show($("token-error"), false);
    show($("dashboard"), true);
    show($("forget-token"), true);
    startRefreshing();
  }

  // -- API -----------------------------------------------------------------------------------

  async function api(method, path, body) {
    const generation = state.generation;
    const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
    const init = { method, headers, cache: "no-store" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, `cannot reach the server (${err.message})`);
    }
    const text = await response.text();
    let payload = null;
    if (text) {
      try {
        payload = JSON.parse(text);
      } catch {
        payload = null;
      }
    }
    if (generation !== state.generation) throw new ApiError(-1, "superseded");
    if (response.status === 401) {
      const reason = errorMessage(payload) || "token rejected";
      askForToken(`The server rejected the token: ${reason}`);
      throw new ApiError(401, reason, payload && payload.ffdl_code);
    }
    if (!response.ok) {
      const reason = errorMessage(payload) || `${response.status} ${response.statusText}`;
      throw new ApiError(response.status, reason, payload && payload.ffdl_code);
    }
    return payload;
  }

  // An error answer's message: FfDL's `description` (its `error` is only the status phrase).
  function errorMessage(payload) {
    if (!payload) return "";
    return payload.description || payload.error || "";
  }

  function setConnection(kind, text) {
    const node = $("connection");
    node.dataset.state = kind;
    node.textContent = text;
  }

  // -- jobs table ----------------------------------------------------------------------------

  function jobCells(model) {
    const training = model.training || {};
    const status = training.training_status || {};
    return [
      el("code", {}, model.model_id),
      model.name || "",
      badge(status.status),
      progressCell(model),
      status.status_message || "",
      el("time", { datetime: status.submitted_at }, localTime(status.submitted_at)),
      `${training.learners ?? "?"}×${training.gpus ?? "?"}`,
      String(model.priority ?? ""),
    ];
  }

  // A running job's bar and time left; a queued job's position and ETA.
  function progressCell(model) {
    if (model.queue) {
      const eta = model.queue.eta_s;
      return `#${model.queue.position ?? "–"}${typeof eta === "number" ? ` ETA ${durationText(eta)}` : ""}`;
    }
    const progress = model.progress;
    if (!progress || typeof progress.fraction !== "number") return "";
    const bar = el("span", { class: "progress", title: `${Math.round(progress.fraction * 100)}%` });
    bar.append(el("span", { style: `width: ${(progress.fraction * 100).toFixed(1)}%` }));
    const left = typeof progress.remaining_s === "number" ? ` ${durationText(progress.remaining_s)} left` : "";
    return el("span", { class: "progress-cell" }, bar, `${Math.round(progress.fraction * 100)}%${left}`);
  }

  // Rows are kept per job and rebuilt only when their content changes, so a row keeps its
  // focus and selection across refreshes.
  const jobRows = new Map();

  function jobRow(model) {
    let row = jobRows.get(model.model_id);
    if (!row) {
      row = el("tr", { dataset: { id: model.model_id }, tabindex: "0" });
      jobRows.set(model.model_id, row);
    }
    const cells = jobCells(model);
    const signature = JSON.stringify(cells.map((c) => (c instanceof Node ? c.textContent : c)));
    if (row.dataset.signature !== signature) {
      row.replaceChildren(...cells.map((cell) => el("td", {}, cell)));
      row.dataset.signature = signature;
    }
    row.classList.toggle("selected", model.model_id === state.selected);
    return row;
  }

  async function refreshJobs() {
    const body = await api("GET", "/v1/models?limit=100");
    const models = body.models || [];
    const shown = new Set(models.map((m) => m.model_id));
    for (const id of [...jobRows.keys()]) if (!shown.has(id)) jobRows.delete(id);
    fillTable($("jobs"), models.map(jobRow), $("jobs-empty"));
    renderEtaAccuracy(models);
    $("jobs-total").textContent = body.total > models.length
      ? `(${models.length} of ${body.total})`
      : `(${models.length})`;
  }

  // -- queue and nodes -----------------------------------------------------------------------

  // For jobs that waited and then started: the first ETA the queue showed, and how far off.
  function renderEtaAccuracy(models) {
    const started = models
      .filter((m) => m.start_estimate)
      .sort((a, b) => String(b.start_estimate.started_at).localeCompare(String(a.start_estimate.started_at)))
      .slice(0, 10);
    const rows = started.map((m) => {
      const estimate = m.start_estimate;
      const error = estimate.error_s;
      const side = error > 0 ? "later" : "earlier";
      return el(
        "tr",
        { dataset: { id: m.model_id, error: String(error) } },
        el("td", {}, el("code", {}, m.model_id)),
        el("td", {}, localTime(estimate.first_eta_at)),
        el("td", {}, localTime(estimate.started_at)),
        el("td", {}, `${durationText(Math.abs(error))} ${side}`),
      );
    });
    fillTable($("eta-accuracy"), rows, $("eta-accuracy-empty"));
  }

  async function refreshCluster() {
    if (!charts.cluster || Date.now() - state.clusterAt < CLUSTER_REFRESH_MS) return;
    state.clusterAt = Date.now();
    const since = charts.cluster.last();
    const body = await api("GET", `/v1/cluster/history${since === null ? "" : `?since=${since}`}`);
    charts.cluster.add(body.samples || []);
    charts.cluster.draw();
  }

  async function refreshQueue() {
    const body = await api("GET", "/v1/queue");
    const rows = (body.queue || []).map((entry) => el(
      "tr",
      { dataset: { id: entry.model_id } },
      el("td", {}, entry.position ?? "–"),
      el("td", {}, el("code", {}, entry.model_id), " ", entry.name || ""),
      el("td", {}, entry.priority ?? ""),
      el("td", {}, entry.eta || ""),
      el("td", {}, entry.reason || ""),
    ));
    fillTable($("queue"), rows, $("queue-empty"));
    const shares = (body.tenants || []).map((row) => el(
      "tr",
      { dataset: { tenant: row.tenant } },
      el("td", {}, row.tenant),
      el("td", {}, String(row.gpus)),
      el("td", {}, String(row.entitled_gpus)),
      el("td", {}, row.share === null || row.share === undefined ? "–" : `${row.share.toFixed(2)}×`),
    ));
    fillTable($("tenant-shares"), shares, $("tenant-shares-empty"));
  }

  // A host without GPUs (gpu_type "cpu") offers CPU slots in their place: say so.
  function slotNoun(gpuType) {
    return gpuType === "cpu" ? "CPU slot" : "gpu";
  }

  function holderText(holder, gpuType) {
    const gpus = (holder.gpu_ids || []).join(",");
    const held = gpus ? ` ${slotNoun(gpuType)} ${gpus}` : " CPUs only";
    // Another tenant's allocation comes without its job id: only that the GPUs are in use.
    if (!holder.model_id) return `in use${held}`;
    return `${holder.model_id} #${holder.learner}${held} (${holder.status})`;
  }

  async function refreshNodes() {
    const body = await api("GET", "/v1/nodes");
    const rows = (body.nodes || []).map((node) => {
      const labels = Object.entries(node.labels || {}).map(([k, v]) => `${k}=${v}`);
      const holders = el("ul", { class: "plain" });
      for (const holder of node.holders || []) {
        holders.append(el("li", {}, holderText(holder, node.gpu_type)));
      }
      const name = el("td", {}, node.name);
      if (node.schedulable === false) name.append(" ", el("span", { class: "tag" }, "cordoned"));
      return el(
        "tr",
        { dataset: { name: node.name } },
        name,
        el("td", {}, `${node.used ? node.used.gpus : 0}/${node.gpus}` +
          (node.gpu_type === "cpu" ? " CPU slots" : "")),
        el("td", {}, typeof node.gpus_busy === "number" ? node.gpus_busy.toFixed(1) : "–"),
        el("td", {}, labels.join(", ")),
        el("td", {}, holders),
      );
    });
    fillTable($("nodes"), rows, $("nodes-empty"));
  }

  // -- detail pane ---------------------------------------------------------------------------

  function placementText(placement) {
    if (!placement || placement.length === 0) return "not placed";
    return placement
      .map((p) => `learner ${p.learner} on ${p.node}` +
        ((p.gpu_ids || []).length ? ` (gpu ${p.gpu_ids.join(",")})` : ""))
      .join("; ");
  }

  // Finish-time fairness: time in the cluster over what the work done would have taken on an
  // equal share; above 1 the job is behind its share.
  function rhoText(rho) {
    return `${rho.toFixed(2)} (${rho > 1 ? "behind" : "at or ahead of"} an equal share)`;
  }

  function queueText(queue) {
    if (!queue) return "not queued";
    const position = queue.position ?? "unplaced";
    return `position ${position}, ETA ${queue.eta || "unknown"}`;
  }

  // One line per attempt (each placement of the job): when it ran, how it ended and why.
  function attemptsList(model) {
    const attempts = model.attempts || [];
    if (attempts.length === 0) return "–";
    const list = el("ul", { class: "plain attempts" });
    for (const attempt of attempts) {
      list.append(el(
        "li",
        { dataset: { attempt: String(attempt.attempt) } },
        `#${attempt.attempt} `,
        badge(attempt.status),
        ` ${localTime(attempt.started) || "–"} → ${localTime(attempt.ended) || "running"}`,
        attempt.reason ? ` — ${attempt.reason}` : "",
      ));
    }
    const restarts = model.restarts || {};
    if (restarts.max) {
      list.append(el("li", {}, `automatic restarts: ${restarts.taken || 0} of ${restarts.max}`));
    }
    return list;
  }

  // Each attempt as a bar on one time axis, from the first start to now (or the last end).
  function renderTimeline(model) {
    const attempts = model.attempts || [];
    const box = $("timeline");
    if (attempts.length === 0) {
      box.replaceChildren(el("p", { class: "empty" }, "Not started yet."));
      return;
    }
    const now = Date.now();
    const spans = attempts.map((a) => ({
      attempt: a,
      start: Date.parse(a.started),
      end: a.ended ? Date.parse(a.ended) : now,
    }));
    const first = Math.min(...spans.map((s) => s.start));
    const last = Math.max(...spans.map((s) => s.end), first + 1000);
    box.replaceChildren(...spans.map(({ attempt, start, end }) => el(
      "span",
      {
        class: "span",
        dataset: { attempt: String(attempt.attempt), status: attempt.status },
        title: `#${attempt.attempt} ${attempt.status}: ${attempt.reason || ""}`,
        style: `left: ${((start - first) / (last - first)) * 100}%; ` +
          `width: ${Math.max(((end - start) / (last - first)) * 100, 0.5)}%`,
      },
      `#${attempt.attempt} ${attempt.status}`,
    )));
  }

  // Only the controls the job's status allows (the API lists them).
  function showActions(model) {
    const allowed = new Set(model.actions || []);
    for (const button of document.querySelectorAll("#detail .actions button[data-action]")) {
      show(button, allowed.has(button.dataset.action));
    }
  }

  function renderSummary(model) {
    const training = model.training || {};
    const status = training.training_status || {};
    const entries = [
      ["Status", badge(status.status)],
      ["Reason", status.status_message || "–"],
      ["Error code", status.error_code || "–"],
      ["Exit code", status.exit_code ?? "–"],
      ["Queue", queueText(model.queue)],
      ["Progress", progressText(model.progress)],
      ["GPU use", gpuText(model.gpu_utilization)],
      ["Fairness (ρ)", typeof model.rho === "number" ? rhoText(model.rho) : "–"],
      ["Start vs ETA", startEstimateText(model.start_estimate)],
      ["Placement", placementText(model.placement)],
      ["Results", (model.results && model.results.location) || "–"],
      ["Command", training.command || "–"],
      ["Submitted", localTime(status.submitted_at) || "–"],
      ["Started", localTime(status.started_at) || "–"],
      ["Completed", localTime(status.completed_at) || "–"],
      ["Attempts", attemptsList(model)],
    ];
    const items = [];
    for (const [label, value] of entries) {
      items.push(el("dt", {}, label), el("dd", { dataset: { field: label.toLowerCase() } }, value));
    }
    $("summary").replaceChildren(...items);
    $("detail-title").textContent = `${model.name || ""} · ${model.model_id}`;
    setBadge($("detail-badge"), status.status);
    showActions(model);
    renderTimeline(model);

    const events = (model.events || []).map((ev) => el(
      "li",
      { dataset: { to: ev.to } },
      el("time", { datetime: ev.time }, localTime(ev.time)),
      " ",
      ev.learner === null || ev.learner === undefined ? "" : `learner ${ev.learner}: `,
      `${ev.from || "–"} → ${ev.to}`,
      ev.reason ? ` — ${ev.reason}` : "",
    ));
    $("events").replaceChildren(...events);
  }

  function renderLogs(lines) {
    const pre = $("logs");
    // Follow the tail only if the reader has not scrolled up to look at something.
    const atBottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 24;
    const learners = new Set(lines.map((item) => (item.meta ? item.meta.learner : null)));
    const multiLearner = learners.size > 1;
    pre.textContent = lines
      .map((item) => (multiLearner && item.meta ? `[${item.meta.learner}] ` : "") + item.line)
      .join("\n");
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function renderMetrics(records) {
    const latest = new Map();
    for (const record of records) {
      const iteration = record.etimes && record.etimes.iteration
        ? record.etimes.iteration.value
        : "";
      for (const [name, value] of Object.entries(record.values || {})) {
        latest.set(`${record.grouplabel}\u0000${name}`, {
          group: record.grouplabel,
          name,
          value: value && value.value !== undefined ? value.value : String(value),
          iteration,
        });
      }
    }
    const rows = [...latest.values()].map((m) => el(
      "tr",
      { dataset: { group: m.group, metric: m.name } },
      el("td", {}, m.group),
      el("td", {}, m.name),
      el("td", { class: "num" }, formatNumber(m.value)),
      el("td", { class: "num" }, m.iteration),
    ));
    fillTable($("metrics"), rows, $("metrics-empty"));
  }

  function formatNumber(text) {
    const value = Number(text);
    if (!Number.isFinite(value) || Number.isInteger(value)) return text;
    return Math.abs(value) >= 1e-3 && Math.abs(value) < 1e6 ? value.toFixed(4) : value.toExponential(3);
  }

  async function refreshDetail() {
    const id = state.selected;
    if (!id) return;
    let model;
    try {
      model = await api("GET", `/v1/models/${encodeURIComponent(id)}`);
    } catch (err) {
      if (err.status === 404 && state.selected === id) {
        closeDetail();
        showNotice(`${id} no longer exists.`);
        return;
      }
      throw err;
    }
    if (state.selected !== id) return;
    renderSummary(model);
    const status = model.training && model.training.training_status
      ? model.training.training_status.status
      : "";
    const live = LIVE_STATES.has(status);
    // A job that has just ended gets one more read so its last lines show up.
    if (live || state.selectedLive || !state.detailLoaded) {
      const path = encodeURIComponent(id);
      const [logs, metrics] = await Promise.all([
        // pos=-1: the page that ends with the last record (FfDL's paging).
        api("GET", `/v1/logs/${path}/loglines?pos=-1&pagesize=${LOG_LINES}`),
        api("GET", `/v1/logs/${path}/emetrics?pos=-1&pagesize=${METRIC_RECORDS}`),
      ]);
      if (state.selected !== id) return;
      renderLogs(logs.models || []);
      renderMetrics(metrics.models || []);
      if (state.detailLoaded) await refreshGpuChart(id);
      state.detailLoaded = true;
    }
    state.selectedLive = live;
  }

  // -- charts and the event stream of the selected job -----------------------------------------

  function drawMetricCharts() {
    charts.metrics.draw();
    show($("metric-charts-empty"), charts.metrics.groups.size === 0);
    charts.resources.drawThroughput(charts.metrics.throughput());
  }

  async function loadCharts(id) {
    const path = encodeURIComponent(id);
    const [records, gpu] = await Promise.all([
      api("GET", `/v1/logs/${path}/emetrics?pos=-1&pagesize=${CHART_RECORDS}`),
      api("GET", `/v1/models/${path}/gpu`),
    ]);
    if (state.selected !== id) return;
    for (const record of records.models || []) charts.metrics.add(record);
    drawMetricCharts();
    charts.resources.drawGpu(gpu);
  }

  async function refreshGpuChart(id) {
    const gpu = await api("GET", `/v1/models/${encodeURIComponent(id)}/gpu`);
    if (state.selected === id) charts.resources.drawGpu(gpu);
  }

  function stopFollowing() {
    if (state.follow) state.follow.abort();
    state.follow = null;
  }

  // Reads the job's Server-Sent Events with fetch (EventSource cannot send the token).
  async function followJob(id) {
    stopFollowing();
    const controller = new AbortController();
    state.follow = controller;
    let response;
    try {
      response = await fetch(`/v1/models/${encodeURIComponent(id)}/events/stream`, {
        headers: { Authorization: `Bearer ${state.token}`, Accept: "text/event-stream" },
        signal: controller.signal,
      });
    } catch (err) {
      return; // aborted, or the server is away: the poll carries on
    }
    if (!response.ok || !response.body) return;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          onStreamFrame(id, frame);
        }
      }
    } catch (err) {
      // aborted when the detail closes or another job is opened
    }
  }

  function onStreamFrame(id, frame) {
    if (state.selected !== id) return;
    let kind = "message";
    let data = "";
    for (const line of frame.split("\n")) {
      if (line.startsWith("event: ")) kind = line.slice(7);
      else if (line.startsWith("data: ")) data += line.slice(6);
    }
    if (!data) return;
    if (kind === "emetric") {
      if (charts.metrics.add(JSON.parse(data))) drawMetricCharts();
    } else if (kind === "status" || kind === "end") {
      // A burst of status events (a finished job's whole history) costs one refresh.
      state.selectedLive = true;
      if (state.statusRefresh === null) {
        state.statusRefresh = window.setTimeout(() => {
          state.statusRefresh = null;
          refreshDetail().catch(reportError);
        }, 150);
      }
    }
  }

  function markSelectedRow() {
    for (const row of $("jobs").tBodies[0].rows) {
      row.classList.toggle("selected", row.dataset.id === state.selected);
    }
  }

  function openDetail(id) {
    showNotice("");
    if (state.selected !== id) {
      state.selected = id;
      state.selectedLive = true;
      state.detailLoaded = false;
      $("summary").replaceChildren();
      $("events").replaceChildren();
      $("logs").textContent = "";
      fillTable($("metrics"), [], $("metrics-empty"));
      $("detail-title").textContent = id;
      setBadge($("detail-badge"), "");
      showMessage("", "");
      $("timeline").replaceChildren();
      show($("detail"), true);
      charts.metrics.reset();
      charts.resources.reset();
      loadCharts(id).then(() => followJob(id)).catch(reportError);
    }
    show($("detail"), true);
    markSelectedRow();
    refreshDetail().catch(reportError);
  }

  function closeDetail() {
    stopFollowing();
    state.selected = null;
    show($("detail"), false);
    markSelectedRow();
  }

  function showNotice(text) {
    const node = $("notice");
    node.textContent = text;
    show(node, Boolean(text));
  }

  function showMessage(kind, text) {
    const node = $("detail-message");
    node.dataset.kind = kind;
    node.textContent = text;
    show(node, Boolean(text));
  }

  async function act(action) {
    const id = state.selected;
    if (!id) return;
    if (action === "delete" && !window.confirm(`Delete ${id}? A live job is cancelled.`)) return;
    const buttons = document.querySelectorAll("#detail .actions button[data-action]");
    buttons.forEach((b) => { b.disabled = true; });
    showMessage("info", `${action} ${id}…`);
    try {
      const path = `/v1/models/${encodeURIComponent(id)}`;
      if (action === "delete") {
        const result = await api("DELETE", path);
        if (result.deleted) {
          closeDetail();
          showNotice(`${id} deleted.`);
        } else {
          showMessage("ok", `${id} is ${result.status}`);
        }
      } else {
        const model = await api("PATCH", path, { status: action });
        showMessage("ok", `${action} accepted: ${model.training.training_status.status}`);
      }
      state.selectedLive = true; // the job changes now: read its output again
    } catch (err) {
      if (err.status !== 401 && err.status !== -1) showMessage("error", err.message);
    } finally {
      buttons.forEach((b) => { b.disabled = false; });
    }
    refreshNow();
  }

  // -- refresh loop --------------------------------------------------------------------------

  function reportError(err) {
    if (err && (err.status === 401 || err.status === -1)) return;
    setConnection("error", err && err.message ? err.message : String(err));
  }

  async function refreshAll() {
    const results = await Promise.allSettled([
      refreshJobs(), refreshQueue(), refreshNodes(), refreshDetail(), refreshCluster(),
    ]);
    const failure = results.find((r) => r.status === "rejected");
    if (failure) reportError(failure.reason);
    else setConnection("ok", `updated ${new Date().toLocaleTimeString()}`);
  }

  function stopRefreshing() {
    state.generation += 1;
    if (state.timer !== null) window.clearTimeout(state.timer);
    state.timer = null;
  }

  function startRefreshing() {
    stopRefreshing();
    const generation = state.generation;
    const loop = async () => {
      await refreshAll();
      if (generation === state.generation) state.timer = window.setTimeout(loop, REFRESH_MS);
    };
    loop();
  }

  function refreshNow() {
    if (state.token) startRefreshing();
  }

  // -- wiring --------------------------------------------------------------------------------

  function wire() {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = $("token-input").value.trim();
      if (token) signIn(token);
    });
    $("forget-token").addEventListener("click", () => askForToken(""));
    const jobs = $("jobs").tBodies[0];
    jobs.addEventListener("click", (event) => {
      const row = event.target.closest("tr[data-id]");
      if (row) openDetail(row.dataset.id);
    });
    jobs.addEventListener("keydown", (event) => {
      const row = event.target.closest("tr[data-id]");
      if (row && (event.key === "Enter" || event.key === " ")) {
        event.preventDefault();
        openDetail(row.dataset.id);
      }
    });
    for (const button of document.querySelectorAll("#detail .actions button[data-action]")) {
      button.addEventListener("click", () => act(button.dataset.action));
    }
    $("close-detail").addEventListener("click", closeDetail);
  }

  async function checkSandbox() {
    // /health needs no token: the warning shows even before sign-in.
    try {
      const response = await fetch("/health", { cache: "no-store" });
      const health = await response.json();
      show($("sandbox-warning"), health.sandbox === false);
      show($("simulated-warning"), health.learners === "simulated");
      show($("transport-warning"), Boolean(health.transport_warning));
    } catch (err) {
      // The connection indicator reports an unreachable server.
    }
  }

  function main() {
    const { MetricCharts, JobResourceCharts, ClusterCharts } = window.FfdlCharts;
    charts.metrics = new MetricCharts($("metric-charts"));
    charts.resources = new JobResourceCharts($("gpu-chart"), $("throughput-chart"));
    charts.cluster = new ClusterCharts($("cluster-gpus"), $("cluster-queue"));
    wire();
    checkSandbox();
    const token = tokenFromFragment() || storedToken();
    if (token) signIn(token);
    else askForToken("");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", main);
  else main();
})();
