// A model's own settings ([models."<id>"] in config.toml), edited on its card: load settings apply at the
// model's next load, the default sampling and system prompt to the next request that sets none of its own.
// Empty means unset (the service-wide setting, or the built-in default, applies).

import { modelPath } from "./api.js";
import { h, problemText, toast } from "./ui.js";

const FIELDS = [
  ["context", "Context (tokens)", "number", "The window cap for this model."],
  ["keep_alive", "Keep loaded", "text", 'Idle time before unloading: "30s", "5m", "1h" or "never".'],
  ["parallel", "Parallel sequences", "number", "Requests decoded together."],
  ["gpu_layers", "GPU layers", "number", "Layers offloaded to the GPU (0: CPU only)."],
  ["speculative", "Speculative decoding", "choice", "Drafts from prompt lookup, verified exactly."],
  ["temperature", "Temperature", "number", "0 to 2 (0: always the likeliest token)."],
  ["top_k", "Top-k", "number", "0 turns it off."],
  ["top_p", "Top-p", "number", "0 to 1."],
  ["min_p", "Min-p", "number", "0 to 1."],
  ["repeat_penalty", "Repeat penalty", "number", "1 turns it off."],
  ["system_prompt", "System prompt", "textarea", "Sent when a request has no system message of its own."],
];
const INTEGER = new Set(["context", "parallel", "gpu_layers", "top_k"]);

/** The settings panel of `model` (collapsed); `saved(model)` gets the model object after a save. */
export function settingsPanel(ctx, model, saved) {
  const slug = model.id.replace(/[^A-Za-z0-9_-]/g, "_");
  const inputs = new Map();
  // Fields the person changed since the panel opened: the saved values, fetched when it opens, arrive
  // after the first keystrokes on a slow machine and must not overwrite them.
  const edited = new Set();
  const status = h("p", { class: "field-error", role: "alert", hidden: true });
  const rows = FIELDS.map(([key, label, kind, help]) => {
    const id = `model-${slug}-${key}`;
    let input;
    if (kind === "choice") {
      input = h("select", { id },
        h("option", { value: "" }, "default"), h("option", { value: "true" }, "on"), h("option", { value: "false" }, "off"));
    } else if (kind === "textarea") {
      input = h("textarea", { id, rows: 3, placeholder: "none" });
    } else {
      input = h("input", { id, type: kind, placeholder: "default", step: INTEGER.has(key) ? "1" : "any" });
    }
    input.setAttribute("aria-describedby", `${id}-help`);
    input.addEventListener("input", () => edited.add(key));
    input.addEventListener("change", () => edited.add(key));
    inputs.set(key, input);
    return h("div", { class: "setting" },
      h("label", { for: id }, label), input, h("p", { class: "help muted", id: `${id}-help` }, help));
  });
  const save = h("button", { type: "button", class: "primary" }, "Save settings");
  const panel = h("details", { class: "model-settings" },
    h("summary", {}, "Settings"),
    h("p", { class: "muted" },
      "Context, keep-alive, parallel sequences, GPU layers and speculative decoding apply at the model's next load; "
      + "sampling and the system prompt to the next request. Empty: the service-wide setting."),
    h("div", { class: "settings-fields" }, rows),
    status,
    h("div", { class: "actions" }, save),
  );
  let shown = {};
  // The saved values into the fields; with `keepEdits`, the fields the person has changed keep theirs.
  const fill = (values, keepEdits = false) => {
    shown = values || {};
    for (const [key, input] of inputs) {
      if (keepEdits && edited.has(key)) continue;
      const value = shown[key];
      input.value = value === null || value === undefined ? "" : String(value);
      input.removeAttribute("aria-invalid");
    }
    if (!keepEdits) edited.clear();
  };
  panel.addEventListener("toggle", async () => {
    if (!panel.open) {
      edited.clear(); // closed: edits not saved are dropped (reopened, the panel shows what is saved)
      return;
    }
    try {
      const full = await ctx.api.get(modelPath(model.id));
      fill(full.extensions.lmsp_tray.settings.values, true);
    } catch (error) {
      toast(problemText(error), "error");
    }
  });
  save.addEventListener("click", async () => {
    const changes = {};
    for (const [key, input] of inputs) {
      const text = input.value.trim();
      let value = text === "" ? null : text;
      if (value !== null && input.type === "number") value = Number(text);
      if (value !== null && input.tagName === "SELECT") value = text === "true";
      const before = shown[key] === undefined ? null : shown[key];
      if (String(value) !== String(before)) changes[key] = value;
    }
    status.hidden = true;
    if (!Object.keys(changes).length) return toast("Nothing to change.");
    try {
      const updated = await ctx.api.call("PATCH", modelPath(model.id, "settings"), changes);
      fill(updated.extensions.lmsp_tray.settings.values);
      toast(`Saved the settings of ${model.id}; load settings apply at its next load.`);
      if (saved) saved(updated);
    } catch (error) {
      status.textContent = problemText(error);
      status.hidden = false;
      const param = error.problem && error.problem.param;
      if (param && inputs.has(param)) inputs.get(param).setAttribute("aria-invalid", "true");
    }
  });
  return panel;
}
