// Where the models run: the backend llama.cpp was built with and the devices it sees (name, memory),
// read from the service document (GET /lmsp/v1, extensions.lmsp_tray) and shown alike on the Models
// and Settings pages; and, on a loaded model's card, how much of it sits on each device.

import { bytes, h } from "./ui.js";

const NAMES = { cpu: "CPU", vulkan: "Vulkan", cuda: "CUDA", metal: "Metal", rocm: "ROCm", hip: "ROCm", sycl: "SYCL" };
const GPU_TYPES = ["gpu", "igpu"];

/** The service document's hardware part: {backend, gpu_offload, devices, device_error?, gpu?: "off"}. */
export async function loadHardware(api) {
  const doc = await api.get("");
  return (doc.extensions && doc.extensions.lmsp_tray) || {};
}

/** The backend by name ("Vulkan"), and in a few words where models go with it. */
export function hardwareSummary(hw) {
  const backend = NAMES[hw.backend] || hw.backend || "CPU";
  const gpus = (hw.devices || []).filter((d) => GPU_TYPES.includes(d.type));
  if (hw.device_error) return [backend, `models run on the CPU: the device probe failed (${hw.device_error})`];
  if (hw.gpu === "off") return [backend, "models run on the CPU: the GPU setting is off"];
  if (gpus.length && hw.gpu_offload) return [backend, "models go on the GPU where they fit, the rest on the CPU"];
  if (hw.backend && hw.backend !== "cpu") {
    return [backend, `models run on the CPU: llama.cpp is built for ${backend} but sees no ${backend} device`];
  }
  return [backend, "models run on the CPU: llama.cpp is built without a GPU backend"];
}

function deviceText(d) {
  const name = d.description && d.description !== d.name ? `${d.description} (${d.name})` : d.name;
  const free = GPU_TYPES.includes(d.type) && d.memory_free_bytes ? `, ${bytes(d.memory_free_bytes)} free at start` : "";
  return `${name} · ${d.type.toUpperCase()} · ${bytes(d.memory_total_bytes)}${free}`;
}

/** A small section naming the backend and listing each device with its memory. */
export function hardwarePanel(hw) {
  const [backend, how] = hardwareSummary(hw);
  return h("section", { class: "hardware", "aria-label": "Backend and devices" },
    h("p", {}, h("strong", {}, "Backend "), h("span", { class: "backend" }, backend), h("span", { class: "muted" }, ` — ${how}`)),
    h("ul", { class: "devices", "aria-label": "Devices" }, (hw.devices || []).map((d) => h("li", {}, deviceText(d)))),
  );
}

/** A loaded model's memory on each device ("CPU 120 MB · Vulkan0 300 MB"), from its extensions. */
export function memoryByDevice(ext) {
  return (ext.devices || []).filter((d) => d.memory_bytes).map((d) => `${d.name} ${bytes(d.memory_bytes)}`).join(" · ");
}
