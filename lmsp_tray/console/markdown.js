// A small Markdown renderer for model answers, building DOM nodes only (model text never becomes
// HTML). Covers what chat models write: fenced code (with a copy button), headings, lists, quotes,
// rules, paragraphs, and inline code, bold, italic, links (http/https only). An unclosed fence, as
// while streaming, runs to the end.

import { copyText, h } from "./ui.js";

export function renderMarkdown(text) {
  const root = document.createDocumentFragment();
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) root.append(h("p", {}, inline(paragraph.join("\n"))));
    paragraph = [];
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```+|~~~+)\s*([\w+#.-]*)/);
    if (fence) {
      flush();
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      root.append(codeBlock(body.join("\n"), fence[2]));
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    if (heading) {
      flush();
      root.append(h(`h${Math.min(6, heading[1].length + 2)}`, {}, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      root.append(h("hr"));
      i += 1;
      continue;
    }
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length) {
        const next = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (!next || /\d/.test(next[1]) !== ordered) break;
        list.append(h("li", {}, inline(next[2])));
        i += 1;
      }
      root.append(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s*>\s?/, ""));
      root.append(h("blockquote", {}, renderMarkdown(quoted.join("\n"))));
      continue;
    }
    if (!line.trim()) flush();
    else paragraph.push(line);
    i += 1;
  }
  flush();
  return root;
}

function codeBlock(code, language) {
  const copy = h("button", { type: "button", class: "copy quiet", "aria-label": "Copy code" }, "Copy");
  copy.addEventListener("click", () => copyText(code, copy));
  return h(
    "figure",
    { class: "code" },
    h("figcaption", {}, h("span", {}, language || "code"), copy),
    h("pre", {}, h("code", {}, code)),
  );
}

// Code spans, **bold**, __bold__, *italic*, _italic_ (not inside words such as snake_case), [links](https://…).
const INLINE =
  /(`+)([\s\S]*?[^`])\1(?!`)|\*\*([^*]+)\*\*|(?<!\w)__([^_]+)__(?!\w)|\*([^*\s][^*]*)\*|(?<!\w)_([^_\s][^_]*)_(?!\w)|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;

/** Inline markup as nodes; everything else stays text. */
export function inline(text) {
  const out = [];
  let last = 0;
  for (const m of text.matchAll(INLINE)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[1]) out.push(h("code", {}, m[2]));
    else if (m[3] || m[4]) out.push(h("strong", {}, inline(m[3] || m[4])));
    else if (m[5] || m[6]) out.push(h("em", {}, inline(m[5] || m[6])));
    else if (m[7]) out.push(h("a", { href: m[8], target: "_blank", rel: "noopener noreferrer" }, m[7]));
    last = m.index + m[0].length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}
