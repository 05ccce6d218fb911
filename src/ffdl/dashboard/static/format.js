// How the ffdl dashboard words times, durations and a job's progress, GPU use and ETA
// accuracy (the API's JSON in, plain text out).
"use strict";

window.FfdlFormat = (() => {
  function localTime(iso) {
    if (!iso) return "";
    const when = new Date(iso);
    return Number.isNaN(when.getTime()) ? iso : when.toLocaleString();
  }

  function durationText(seconds) {
    if (typeof seconds !== "number" || seconds < 0) return "";
    const s = Math.round(seconds);
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
    return `${Math.floor(s / 3600)}h ${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  }

  function progressText(progress) {
    if (!progress) return "–";
    const parts = [];
    if (progress.step !== null && progress.step !== undefined) {
      parts.push(`step ${progress.step}${progress.total_steps ? ` of ${progress.total_steps}` : ""}`);
    }
    if (typeof progress.fraction === "number") parts.push(`${Math.round(progress.fraction * 100)}%`);
    if (typeof progress.samples_per_s === "number") parts.push(`${progress.samples_per_s.toFixed(1)} samples/s`);
    if (typeof progress.remaining_s === "number") {
      parts.push(`${durationText(progress.remaining_s)} left (ends ${localTime(progress.estimated_end_at)})`);
    }
    return parts.join(", ") || "–";
  }

  function gpuText(use) {
    if (!use) return "–";
    let text = `${use.average.toFixed(0)}% average`;
    if (typeof use.latest === "number") text += `, ${use.latest.toFixed(0)}% now`;
    if (use.idle_flagged) text += " — flagged: GPUs held but idle";
    return text;
  }

  function startEstimateText(estimate) {
    if (!estimate) return "–";
    const side = estimate.error_s > 0 ? "later" : "earlier";
    return `started ${durationText(Math.abs(estimate.error_s))} ${side} than first estimated`;
  }

  return { localTime, durationText, progressText, gpuText, startEstimateText };
})();
