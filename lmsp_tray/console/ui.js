// Small helpers the views share: building DOM nodes (never from HTML strings), formatting, toasts.

/** An element: h("button", {class: "primary", onclick: fn}, "Save"). Text children stay text. */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  append(node, children);
  return node;
}

export function append(node, children) {
  for (const child of [children].flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function replace(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** Decimal units, as model sites print sizes: 512 B, 8.4 KB, 253 MB, 4.9 GB. */
export function bytes(n) {
  if (n === null || n === undefined || n < 0) return "–";
  if (n < 1000) return `${n} B`;
  let value = n;
  for (const unit of ["KB", "MB", "GB", "TB"]) {
    value /= 1000;
    if (value < 999.5 || unit === "TB") return `${value < 9.95 ? value.toFixed(1) : Math.round(value)} ${unit}`;
  }
  return `${n} B`;
}

export function ms(value) {
  if (value === null || value === undefined) return "–";
  return value < 1000 ? `${Math.round(value)} ms` : `${(value / 1000).toFixed(value < 10000 ? 2 : 1)} s`;
}

export function rate(value) {
  return value === null || value === undefined ? "–" : `${value.toFixed(value < 10 ? 1 : 0)} tok/s`;
}

export function count(n, one, many = `${one}s`) {
  return `${n} ${n === 1 ? one : many}`;
}

/** A time of day for `seconds` since the epoch; the date too when it is not today. */
export function when(seconds) {
  if (!seconds) return "–";
  const date = new Date(seconds * 1000);
  const today = new Date().toDateString() === date.toDateString();
  return today ? date.toLocaleTimeString() : date.toLocaleString();
}

export function ago(seconds) {
  if (!seconds) return "never";
  const diff = Date.now() / 1000 - seconds;
  if (diff < 60) return "just now";
  if (diff < 3600) return `${Math.floor(diff / 60)} min ago`;
  if (diff < 86400) return `${Math.floor(diff / 3600)} h ago`;
  return new Date(seconds * 1000).toLocaleDateString();
}

/** A short message in the corner, read out by screen readers. */
export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast ${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 9000 : 4500);
}

/** The sentence to show for a failed call (`ApiError` carries the service's problem document). */
export function problemText(error) {
  if (error && error.problem && error.problem.detail) return error.problem.detail;
  if (error && error.name === "TypeError") return "The service cannot be reached. Is lmsp-tray still running?";
  return (error && error.message) || "Something went wrong.";
}

/** Copy `text`, then say so on `button` for a moment. */
export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    if (button) {
      const label = button.textContent;
      button.textContent = "Copied";
      setTimeout(() => (button.textContent = label), 1500);
    }
  } catch {
    toast("Could not copy: select the text and copy it yourself.", "error");
  }
}

/** Run `fn` every `seconds` while `isActive()`; returns a stop function. Skips a beat if one is still running. */
export function every(seconds, fn) {
  let busy = false;
  const timer = setInterval(async () => {
    if (busy || document.hidden) return;
    busy = true;
    try {
      await fn();
    } finally {
      busy = false;
    }
  }, seconds * 1000);
  return () => clearInterval(timer);
}
