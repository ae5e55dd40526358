// Settings: the common config.toml keys in a form. The service checks each value by the same rules as
// at start, writes config.toml back keeping its comments and other keys, applies what it can at once
// and says what waits for a restart or for the next model load. Above the form: the backend and devices
// the service runs with (what the GPU setting acts on).

import { hardwarePanel, loadHardware } from "./hardware.js";
import { h, problemText, replace, toast } from "./ui.js";

const APPLIES = { restart: "after a restart", now: "applies at once", next_load: "from the next model load" };

let ctx;
let el = {};
let doc = null;
const inputs = new Map(); // key -> {field, input, error}

export function mount(root, context) {
  ctx = context;
  el.file = h("p", { class: "muted" });
  el.banner = h("p", { class: "banner warning", hidden: true, role: "status" });
  el.fields = h("div", { class: "settings-fields" });
  el.hardware = h("div", {});
  el.save = h("button", { type: "submit", class: "primary" }, "Save");
  el.reset = h("button", { type: "button", class: "quiet", onclick: () => render(doc) }, "Undo changes");
  el.form = h("form", { class: "settings", onsubmit: save, novalidate: true },
    el.fields, h("div", { class: "actions" }, el.save, el.reset));
  replace(root, h("div", { class: "page narrow" },
    h("div", { class: "page-head" }, h("h1", {}, "Settings"), el.file), el.hardware, el.banner, el.form));
}

export async function show() {
  loadHardware(ctx.api).then((hw) => replace(el.hardware, hardwarePanel(hw)), () => replace(el.hardware));
  try {
    render(await ctx.api.get("/settings"));
  } catch (error) {
    toast(problemText(error), "error");
  }
}

export function hide() {}

function render(settings) {
  if (!settings) return;
  doc = settings;
  el.file.textContent = `Saved in ${settings.config_file}`;
  el.banner.hidden = !settings.restart_required.length;
  el.banner.textContent = settings.restart_required.length
    ? `Restart lmsp-tray to apply: ${settings.restart_required.map(labelOf).join(", ")}.`
    : "";
  inputs.clear();
  replace(el.fields, settings.fields.map((field) => row(field, settings.values[field.key], settings.running[field.key])));
}

function labelOf(key) {
  const field = doc.fields.find((f) => f.key === key);
  return field ? field.label : key;
}

function shown(value) {
  if (Array.isArray(value)) return value.length ? value.join(", ") : "none";
  return value === null || value === undefined || value === "" ? "auto" : String(value);
}

function row(field, value, running) {
  const id = `setting-${field.key}`;
  let input;
  if (field.kind === "bool") {
    input = h("input", { id, type: "checkbox", checked: Boolean(value) });
  } else if (field.kind === "choice") {
    input = h("select", { id }, field.choices.map((c) => h("option", { value: c, selected: c === value }, c)));
  } else if (field.kind === "scopes") {
    const chosen = new Set(value || []);
    input = h("fieldset", { id, class: "scopes" }, field.choices.map((c) =>
      h("label", {}, h("input", { type: "checkbox", value: c, checked: chosen.has(c) }), ` ${c}`)));
  } else if (field.kind === "folders") {
    input = h("textarea", { id, rows: 3, spellcheck: "false" });
    input.value = (value || []).join("\n");
  } else if (field.kind === "duration") {
    input = h("input", { id, type: "text", value: value ?? "", spellcheck: "false" });
  } else {
    const port = field.kind === "port" || field.kind === "optional_port";
    const min = port || field.kind === "int" || field.kind === "auto_int" ? 1 : null;
    input = h("input", { id, type: "number", min, max: port ? 65535 : null, step: 1, value: value ?? "",
      placeholder: field.kind === "auto_int" ? "auto" : field.kind === "optional_port" ? "off" : null });
  }
  const help = h("p", { class: "help muted", id: `${id}-help` }, field.help, " ", h("span", { class: `applies ${field.applies}` }, APPLIES[field.applies]));
  const error = h("p", { class: "field-error", id: `${id}-error`, hidden: true });
  // What the service uses now, when it is not what the file says (a command-line option, a pending restart).
  const differs = running !== undefined && JSON.stringify(running) !== JSON.stringify(value);
  const effect = differs ? h("p", { class: "in-effect muted", id: `${id}-now` }, `In effect now: ${shown(running)}`) : null;
  input.setAttribute("aria-describedby", `${id}-help ${id}-error${effect ? ` ${id}-now` : ""}`);
  inputs.set(field.key, { field, input, error });
  const label = h("label", { for: id }, field.label);
  return h("div", { class: `setting ${field.kind === "bool" ? "bool" : ""}` }, label, input, help, effect, error);
}

function valueOf({ field, input }) {
  if (field.kind === "bool") return input.checked;
  if (field.kind === "scopes") return [...input.querySelectorAll("input:checked")].map((i) => i.value);
  if (field.kind === "folders") return input.value.split("\n").map((s) => s.trim()).filter(Boolean);
  if (field.kind === "choice" || field.kind === "duration") return input.value.trim();
  if (input.value.trim() === "") return field.kind === "auto_int" || field.kind === "optional_port" ? null : "";
  return Number(input.value);
}

async function save(event) {
  event.preventDefault();
  const changes = {};
  for (const [key, entry] of inputs) {
    entry.error.hidden = true;
    entry.input.removeAttribute("aria-invalid");
    const value = valueOf(entry);
    if (JSON.stringify(value) !== JSON.stringify(doc.values[key] ?? null)) changes[key] = value;
  }
  if (!Object.keys(changes).length) return toast("Nothing changed.");
  el.save.disabled = true;
  try {
    const result = await ctx.api.call("PATCH", "/settings", changes);
    render(result);
    const waiting = result.restart_required.length ? ` Restart needed for: ${result.restart_required.map(labelOf).join(", ")}.` : "";
    toast(`Saved to config.toml.${waiting}`);
  } catch (error) {
    const param = error.problem && error.problem.param;
    const entry = param && inputs.get(param);
    if (entry) {
      entry.error.textContent = error.problem.detail;
      entry.error.hidden = false;
      entry.input.setAttribute("aria-invalid", "true");
      entry.input.focus();
    } else {
      toast(problemText(error), "error");
    }
  } finally {
    el.save.disabled = false;
  }
}
