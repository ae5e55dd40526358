// Models: everything discovery found, with where each file is and what it is; load and unload with
// their progress; where a loaded model runs and the memory it takes; files that cannot be used, apart,
// with the whole reason.

import { modelPath } from "./api.js";
import { bytes, count, every, h, problemText, replace, toast } from "./ui.js";

const SOURCES = {
  "lmsp-tray": "lmsp-tray folder",
  custom: "Your folder",
  "lm-studio": "LM Studio",
  ollama: "Ollama",
  huggingface: "Hugging Face cache",
  "llama.cpp": "llama.cpp cache",
};

let ctx;
let el = {};
let stopPolling = null;
let fastUntil = 0; // poll every second while a load or unload may be running
const started = new Map(); // model id -> when this page saw it start loading

export function mount(root, context) {
  ctx = context;
  el.summary = h("p", { class: "muted", "aria-live": "polite" });
  el.grid = h("div", { class: "cards" });
  el.broken = h("section", { class: "broken", hidden: true, "aria-labelledby": "broken-title" });
  replace(
    root,
    h("div", { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Models"), el.summary),
      el.grid,
      el.broken,
    ),
  );
}

export async function show() {
  await refresh();
  let tick = 0;
  stopPolling = every(1, async () => {
    tick += 1;
    if (Date.now() < fastUntil || tick % 10 === 0) await refresh();
  });
}

export function hide() {
  if (stopPolling) stopPolling();
  stopPolling = null;
}

async function refresh() {
  let list, incomplete;
  try {
    const listing = await ctx.api.get("/models");
    list = listing.data;
    incomplete = (listing.extensions && listing.extensions.lmsp_tray && listing.extensions.lmsp_tray.incomplete_files) || [];
  } catch (error) {
    return toast(problemText(error), "error");
  }
  const usable = list.filter((m) => !fileError(m));
  const broken = list.filter((m) => !usable.includes(m)).concat(incomplete.map(asBroken));
  if (list.some((m) => m.state === "loading" || m.state === "unloading")) fastUntil = Date.now() + 2000;
  const loaded = usable.filter((m) => m.state === "loaded").length;
  el.summary.textContent = `${count(usable.length, "model")} · ${loaded} loaded`;
  replace(el.grid, usable.length ? usable.map(card) : h("p", { class: "empty" }, emptyText()));
  renderBroken(broken);
}

function emptyText() {
  return "No models found. Put .gguf files in lmsp-tray's models folder or add a folder in Settings.";
}

/** A file whose header is not all there yet (a copy or download in progress), shown like a broken model. */
function asBroken(file) {
  return { id: file.file_name, error: { detail: file.error }, extensions: { lmsp_tray: { path: file.path } }, incomplete: true };
}

/** Why discovery could not use the file (as opposed to a failed load, which can be retried), if so. */
function fileError(model) {
  return model.extensions && model.extensions.lmsp_tray && model.extensions.lmsp_tray.file_error;
}

function card(model) {
  const ext = (model.extensions && model.extensions.lmsp_tray) || {};
  const stateText = { loaded: "Loaded", loading: "Loading…", unloading: "Unloading…", available: "Available", error: "Failed" };
  const facts = [
    ["Source", SOURCES[model.source] || model.source],
    ["Size", bytes(model.size_bytes)],
    ["Quantization", model.quantization || "–"],
    ["Context", model.context_length ? `${model.context_length.toLocaleString()} tokens` : "–"],
    ["Parameters", model.parameters || "–"],
    ["Architecture", model.architecture || "–"],
  ];
  const actions = h("div", { class: "actions" });
  const busy = model.state === "loading" || model.state === "unloading";
  if (model.state === "loaded") {
    actions.append(h("button", { type: "button", onclick: () => act(model, "unload") }, "Unload"));
  } else {
    actions.append(
      h("button", { type: "button", class: "primary", disabled: busy, onclick: () => act(model, "load") },
        model.state === "error" ? "Retry load" : "Load"),
    );
  }
  actions.append(
    h("button", { type: "button", class: "quiet", onclick: () => reveal(model), "aria-label": `Open the folder of ${model.id}` }, "Open folder"),
  );
  const body = [
    h("div", { class: "card-head" },
      h("h2", { class: "model-id" }, model.id),
      h("span", { class: `badge ${model.state}` }, stateText[model.state] || model.state),
    ),
    h("p", { class: "path", title: ext.path || "" }, ext.file_name || "", ext.path ? h("span", { class: "muted" }, ` — ${folderOf(ext.path)}`) : null),
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    // Fill-in-the-middle is an extension on /lmsp/v1 (LMSP fixes the capability names); shown as one.
    h("ul", { class: "chips", "aria-label": "Capabilities" },
      [...(model.capabilities || []), ...(ext.fill_in_the_middle ? ["fill-in-the-middle"] : [])].map((c) => h("li", {}, c))),
  ];
  if (model.state === "loading" || model.state === "unloading") {
    if (!started.has(model.id)) started.set(model.id, Date.now());
    const seconds = Math.round((Date.now() - started.get(model.id)) / 1000);
    body.push(
      h("div", { class: "progress" },
        // Indeterminate unless the service reports a fraction (extensions.lmsp_tray.load_progress, 0..1).
        h("progress", { "aria-label": `${stateText[model.state]} ${model.id}`, max: 1, value: ext.load_progress ?? null }),
        h("span", { class: "muted" },
          ext.load_progress != null ? `${Math.round(ext.load_progress * 100)}% · ${seconds} s` : `${seconds} s`),
      ),
    );
  } else {
    started.delete(model.id);
  }
  if (model.state === "loaded") {
    const memory = (ext.memory_bytes || 0) + (ext.gpu_memory_bytes || 0);
    body.push(
      h("p", { class: "runs" },
        h("strong", {}, "Runs on "), ext.placement || ext.device || "–",
        ext.parallel ? ` · ${count(ext.parallel, "parallel sequence")}` : "",
        memory ? ` · about ${bytes(memory)} of memory${ext.gpu_memory_bytes ? ` (${bytes(ext.gpu_memory_bytes)} on the GPU)` : ""}` : "",
      ),
    );
  }
  if (model.state === "error" && model.error) {
    body.push(h("p", { class: "problem" }, model.error.detail));
  }
  body.push(actions);
  return h("article", { class: "card model", "aria-label": model.id }, body);
}

function folderOf(path) {
  const cut = Math.max(path.lastIndexOf("/"), path.lastIndexOf("\\"));
  return cut > 0 ? path.slice(0, cut) : path;
}

function renderBroken(list) {
  el.broken.hidden = !list.length;
  if (!list.length) return el.broken.replaceChildren();
  replace(
    el.broken,
    h("h2", { id: "broken-title" }, `Files that cannot be used (${list.length})`),
    h("p", { class: "muted" }, "These .gguf files were found but cannot be loaded. They are not counted as models."),
    h("ul", { class: "broken-list" },
      list.map((m) => {
        const ext = (m.extensions && m.extensions.lmsp_tray) || {};
        return h("li", {},
          h("p", { class: "path" }, ext.path || m.id),
          h("p", { class: "problem" }, m.error.detail),
          m.incomplete ? null : h("button", { type: "button", class: "quiet", onclick: () => reveal(m) }, "Open folder"),
        );
      }),
    ),
  );
}

async function act(model, action) {
  fastUntil = Date.now() + 3_600_000; // until the answer comes
  started.set(model.id, Date.now());
  const verb = action === "load" ? "Loading" : "Unloading";
  toast(`${verb} ${model.id}…`);
  setTimeout(refresh, 150);
  try {
    await ctx.api.post(modelPath(model.id, action));
    toast(`${model.id} ${action === "load" ? "loaded" : "unloaded"}.`);
  } catch (error) {
    toast(problemText(error), "error");
  } finally {
    fastUntil = Date.now() + 2000;
    await refresh();
  }
}

async function reveal(model) {
  try {
    const result = await ctx.api.post("/console/reveal", { model: model.id });
    toast(`Opened ${result.folder}`);
  } catch (error) {
    toast(problemText(error), "error");
  }
}
