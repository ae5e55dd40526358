// Models: the backend and devices the service runs with; everything discovery found, with where each
// file is and what it is; load and unload with their progress; where a loaded model runs (its layers on
// the GPU, or the CPU) and the memory it takes on each device; files that cannot be used, apart, with the
// whole reason.

import { modelPath } from "./api.js";
import { hardwarePanel, loadHardware, memoryByDevice } from "./hardware.js";
import { discoverPanel } from "./discover.js";
import { settingsPanel } from "./model_settings.js";
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
const panels = new Map(); // model id -> its settings panel (kept across refreshes, so an edit is not lost)

export function mount(root, context) {
  ctx = context;
  el.summary = h("p", { class: "muted", "aria-live": "polite" });
  el.hardware = h("div", {});
  el.grid = h("div", { class: "cards" });
  el.broken = h("section", { class: "broken", hidden: true, "aria-labelledby": "broken-title" });
  replace(
    root,
    h("div", { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Models"), el.summary),
      el.hardware,
      discoverPanel(context, () => refresh()),
      el.grid,
      el.broken,
    ),
  );
}

export async function show() {
  loadHardware(ctx.api).then((hw) => replace(el.hardware, hardwarePanel(hw)), () => replace(el.hardware));
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
  let list, incomplete, listing;
  try {
    listing = await ctx.api.get("/models");
    list = listing.data;
    incomplete = (listing.extensions && listing.extensions.lmsp_tray && listing.extensions.lmsp_tray.incomplete_files) || [];
  } catch (error) {
    return toast(problemText(error), "error");
  }
  const usable = list.filter((m) => !fileError(m));
  const broken = list.filter((m) => !usable.includes(m)).concat(incomplete.map(asBroken));
  if (list.some((m) => m.state === "loading" || m.state === "unloading")) fastUntil = Date.now() + 2000;
  const loaded = usable.filter((m) => m.state === "loaded").length;
  const disk = listing.extensions && listing.extensions.lmsp_tray && listing.extensions.lmsp_tray.disk_bytes;
  el.summary.textContent = `${count(usable.length, "model")} · ${loaded} loaded${disk ? ` · ${bytes(disk)} on disk` : ""}`;
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
  if (ext.deletable) {
    actions.append(
      h("button", { type: "button", class: "quiet danger", disabled: busy, onclick: () => remove(model), "aria-label": `Delete ${model.id}` }, "Delete"),
    );
  }
  const body = [
    h("div", { class: "card-head" },
      h("h2", { class: "model-id" }, model.id),
      h("span", { class: `badge ${model.state}` }, stateText[model.state] || model.state),
    ),
    h("p", { class: "path", title: ext.path || "" }, ext.file_name || "", ext.path ? h("span", { class: "muted" }, ` — ${folderOf(ext.path)}`) : null),
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    // Fill-in-the-middle is an extension on /lmsp/v1 (LMSP fixes the capability names); shown as one.
    h("ul", { class: "chips", "aria-label": "Capabilities" },
      [...(model.capabilities || []), ...(ext.fill_in_the_middle ? ["fill-in-the-middle"] : []),
        ...((ext.input_modalities || []).includes("image") ? ["vision"] : []),
        ...((ext.input_modalities || []).includes("audio") ? ["audio"] : [])].map((c) => h("li", {}, c))),
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
    const layers = ext.total_layers ? `${ext.gpu_layers || 0} of ${ext.total_layers} layers on the GPU` : "";
    const where = memoryByDevice(ext);
    body.push(
      h("p", { class: "runs" },
        h("strong", {}, "Runs on "), ext.placement || ext.device || "–",
        ext.parallel ? ` · ${count(ext.parallel, "parallel sequence")}` : "",
        memory ? ` · about ${bytes(memory)} of memory${ext.gpu_memory_bytes ? ` (${bytes(ext.gpu_memory_bytes)} on the GPU)` : ""}` : "",
      ),
      h("p", { class: "placement muted" }, [layers, where ? `memory: ${where}` : ""].filter(Boolean).join(" · ")),
    );
    if (ext.gpu_fallback) body.push(h("p", { class: "problem gpu-fallback" }, `Fewer layers on the GPU: ${ext.gpu_fallback}`));
  }
  if (model.state === "error" && model.error) {
    body.push(h("p", { class: "problem" }, model.error.detail));
  }
  body.push(actions);
  if (!panels.has(model.id)) panels.set(model.id, settingsPanel(ctx, model, () => refresh()));
  body.push(panels.get(model.id));
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

/** Delete a model the service owns (the button shows only on those), after the person confirms. */
async function remove(model) {
  if (!window.confirm(`Delete ${model.id} (${bytes(model.size_bytes)}) from disk? This cannot be undone.`)) return;
  const path = modelPath(model.id);
  try {
    let result;
    try {
      result = await ctx.api.call("DELETE", path);
    } catch (error) {
      if (error.status !== 409 || !/generating/.test(error.message)) throw error;
      if (!window.confirm(`${model.id} is generating. Stop its requests and delete it anyway?`)) return;
      result = await ctx.api.call("DELETE", `${path}?force=true`);
    }
    panels.delete(model.id);
    toast(`Deleted ${model.id}: ${bytes(result.freed_bytes)} freed.`);
  } catch (error) {
    toast(problemText(error), "error");
  }
  await refresh();
}

async function reveal(model) {
  try {
    const result = await ctx.api.post("/console/reveal", { model: model.id });
    toast(`Opened ${result.folder}`);
  } catch (error) {
    toast(problemText(error), "error");
  }
}
