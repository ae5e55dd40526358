// Activity: a live table of recent requests, a chart of tokens/s and memory over the last minutes, and
// the service log (the service removes anything shaped like a secret before it keeps a line).

import { bytes, every, h, ms, problemText, replace, toast } from "./ui.js";

const SVG = "http://www.w3.org/2000/svg";
const MAX_ROWS = 200; // shown
const KEEP_ROWS = 500; // as many as the service keeps
const MAX_LINES = 300;
const CONSOLE = "lmsp-tray console"; // the console's own token

let ctx;
let el = {};
let stopPolling = null;
let cursor = 0;
const rows = new Map(); // request id -> row data
let lines = [];

export function mount(root, context) {
  ctx = context;
  el.rate = chart("Tokens per second", "tok/s");
  el.memory = chart("Memory", "bytes", ["service", "models"]);
  el.requests = h("tbody");
  el.log = h("ol", { class: "log", "aria-label": "Service log" });
  el.follow = h("input", { type: "checkbox", id: "log-follow", checked: true });
  el.own = h("input", { type: "checkbox", id: "own-reads", onchange: () => renderRequests() });
  replace(
    root,
    h("div", { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Activity"),
        h("p", { class: "muted" }, "Up to the last 10 minutes; this view refreshes every 2 seconds.")),
      h("div", { class: "charts" }, el.rate.node, el.memory.node),
      h("section", { "aria-labelledby": "requests-title" },
        h("div", { class: "section-head" }, h("h2", { id: "requests-title" }, "Requests"),
          h("label", { class: "check", for: "own-reads" }, el.own, " Show this console's own reads")),
        h("div", { class: "table-wrap" },
          h("table", { class: "requests" },
            h("thead", {}, h("tr", {},
              ["Time", "App", "Model", "Endpoint", "In", "Out", "First token", "Tokens/s", "Status"].map((t) => h("th", { scope: "col" }, t)))),
            el.requests,
          ),
        ),
      ),
      h("section", { "aria-labelledby": "log-title" },
        h("div", { class: "section-head" }, h("h2", { id: "log-title" }, "Service log"),
          h("label", { class: "check", for: "log-follow" }, el.follow, " Follow")),
        el.log,
      ),
    ),
  );
}

export async function show() {
  await refresh();
  stopPolling = every(2, refresh);
}

export function hide() {
  if (stopPolling) stopPolling();
  stopPolling = null;
}

async function refresh() {
  let doc;
  try {
    doc = await ctx.api.get(`/activity?after=${cursor}`);
  } catch (error) {
    return toast(problemText(error), "error");
  }
  cursor = doc.cursor;
  for (const r of doc.requests) rows.set(r.id, r);
  const ids = [...rows.keys()].sort((a, b) => b - a);
  for (const id of ids.slice(KEEP_ROWS)) rows.delete(id);
  lines = lines.concat(doc.log).slice(-MAX_LINES);
  renderRequests();
  renderLog(doc.log.length > 0);
  const points = doc.series;
  el.rate.draw(points.map((p) => [p.time, p.tokens_per_s]), (v) => `${v.toFixed(1)} tok/s`);
  el.memory.draw(
    points.map((p) => [p.time, p.rss_bytes === null ? p.models_bytes : p.rss_bytes]),
    bytes,
    points.map((p) => [p.time, p.models_bytes]),
  );
}

/** The console's own polling (its GET requests) is left out unless asked for: it would drown the rest. */
function renderRequests() {
  const mine = (r) => r.app === CONSOLE && (r.method === "GET" || r.method === "HEAD");
  const list = [...rows.values()]
    .filter((r) => el.own.checked || !mine(r))
    .sort((a, b) => b.id - a.id)
    .slice(0, MAX_ROWS);
  if (!list.length) {
    replace(el.requests, h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No requests yet.")));
    return;
  }
  replace(
    el.requests,
    list.map((r) => {
      const failed = r.status >= 400 || r.outcome === "failed";
      const status = [r.status === null ? "…" : String(r.status), r.outcome && r.outcome !== "completed" ? r.outcome : ""]
        .filter(Boolean)
        .join(" ");
      return h("tr", { class: failed ? "failed" : r.done ? "" : "running" },
        h("td", {}, new Date(r.time * 1000).toLocaleTimeString()),
        h("td", {}, r.app || h("span", { class: "muted" }, "—")),
        h("td", { class: "model-cell" }, r.model || ""),
        h("td", {}, h("code", {}, `${r.method} ${r.endpoint.replace(/^\/lmsp\/v1/, "") || "/"}`)),
        h("td", { class: "num" }, r.tokens_in ?? ""),
        h("td", { class: "num" }, r.tokens_out ?? ""),
        h("td", { class: "num" }, r.ttft_ms === null ? "" : ms(r.ttft_ms)),
        h("td", { class: "num" }, r.tokens_per_s === null ? "" : r.tokens_per_s.toFixed(1)),
        h("td", {}, status),
      );
    }),
  );
}

function renderLog(grew) {
  replace(
    el.log,
    lines.map((line) =>
      h("li", { class: `level-${line.level.toLowerCase()}` },
        h("time", {}, new Date(line.time * 1000).toLocaleTimeString()), " ",
        h("span", { class: "level" }, line.level), " ",
        h("span", { class: "logger" }, line.logger.replace(/^lmsp_tray\./, "")), " ",
        line.message,
      ),
    ),
  );
  if (!lines.length) el.log.append(h("li", { class: "muted" }, "Nothing logged yet."));
  if (grew && el.follow.checked) el.log.scrollTop = el.log.scrollHeight;
}

/** A small line chart (SVG built node by node); `draw(points, format, second?)` redraws it. */
function chart(title, unit, names = ["", ""]) {
  const width = 480;
  const height = 120;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("preserveAspectRatio", "none");
  const now = h("p", { class: "chart-now" });
  const caption = h("figcaption", {}, h("span", {}, title), now);
  const node = h("figure", { class: "chart", "data-unit": unit }, caption, svg);
  const line = (cls) => {
    const path = document.createElementNS(SVG, "polyline");
    path.setAttribute("class", cls);
    svg.append(path);
    return path;
  };
  const main = line("series");
  const second = line("series second");
  return {
    node,
    draw(points, format, secondPoints) {
      const all = points.concat(secondPoints || []);
      const top = Math.max(1e-9, ...all.map(([, v]) => v || 0)) * 1.1;
      // The time axis spans what there is, from one minute up to the ten the service keeps.
      const end = points.length ? points[points.length - 1][0] : Date.now() / 1000;
      const span = Math.min(600, Math.max(60, points.length ? end - points[0][0] : 0));
      const start = end - span;
      const at = ([t, v]) => `${(((t - start) / span) * width).toFixed(1)},${(height - ((v || 0) / top) * height).toFixed(1)}`;
      main.setAttribute("points", points.map(at).join(" "));
      second.setAttribute("points", (secondPoints || []).map(at).join(" "));
      const last = points.length ? points[points.length - 1][1] : null;
      const lastSecond = secondPoints && secondPoints.length ? secondPoints[secondPoints.length - 1][1] : null;
      const label = (name, value) => `${name ? `${name} ` : ""}${format(value)}`;
      now.textContent =
        last === null ? "no data yet" : label(names[0], last) + (lastSecond !== null ? ` · ${label(names[1], lastSecond)}` : "");
      svg.setAttribute(
        "aria-label",
        `${title} over the last ${Math.round(span / 60)} minutes: now ${now.textContent}, peak ${format(top / 1.1)}`,
      );
    },
  };
}
