// Chat: pick a model, talk to it with the answer streaming in, stop it, keep conversations.
//
// A conversation lives on the service as stored responses (`store: true`), each turn continuing from
// the last with `previous_response_id`; this page keeps only the list of conversations (titles, their
// response ids and sampling settings) in localStorage, and reads the turns back from the service.
// Stop aborts the request: the service notices the closed connection and stops decoding at once. A
// stopped answer stays on screen but is not part of the conversation (the service keeps finished
// turns only). With a vision model, images can be attached (the button, pasting, or dropping files on
// the composer): they go with the message as `input_image` parts (data: URLs). With a model that takes
// audio, audio files likewise (the button or dropping them), as `input_audio` parts (base64 and format).

import { renderMarkdown } from "./markdown.js";
import { bytes, h, ms, problemText, rate, replace, toast } from "./ui.js";

const CHATS_KEY = "lmsp-tray.console.chats";
const CURRENT_KEY = "lmsp-tray.console.chat";
const DEFAULT_SETTINGS = { temperature: 0.8, max_output_tokens: "", instructions: "" };

let ctx;
let el = {};
let models = [];
let running = null; // {controller} while an answer streams
let shownChat = null; // the id of the conversation on screen
let attached = []; // data: URLs of the images and audio files to send with the next message
const MAX_ATTACHED = 8;

// -- conversations in localStorage ---------------------------------------------------------------
function chats() {
  try {
    return JSON.parse(localStorage.getItem(CHATS_KEY) || "[]");
  } catch {
    return [];
  }
}

function saveChats(list) {
  localStorage.setItem(CHATS_KEY, JSON.stringify(list.slice(0, 200)));
}

function currentChat() {
  const id = sessionStorage.getItem(CURRENT_KEY);
  return chats().find((c) => c.id === id) || null;
}

function updateChat(chat) {
  const list = chats().filter((c) => c.id !== chat.id);
  list.unshift(chat);
  saveChats(list);
}

function newChat() {
  const chat = {
    id: crypto.randomUUID(),
    title: "New chat",
    model: el.model.value || (models[0] && models[0].id) || "",
    turns: [],
    settings: { ...DEFAULT_SETTINGS },
    updated: Date.now(),
  };
  sessionStorage.setItem(CURRENT_KEY, chat.id);
  return chat;
}

// -- the view ------------------------------------------------------------------------------------
export function mount(root, context) {
  ctx = context;
  el.list = h("ul", { class: "chat-list", "aria-label": "Conversations" });
  el.newChat = h("button", { type: "button", class: "primary wide", onclick: startNewChat }, "New chat");
  el.model = h("select", { id: "chat-model", onchange: onModelChange });
  el.modelState = h("span", { class: "muted", id: "chat-model-state", "aria-live": "polite" });
  el.temperature = h("input", { id: "chat-temperature", type: "number", min: 0, max: 2, step: 0.1 });
  el.maxTokens = h("input", { id: "chat-max-tokens", type: "number", min: 1, step: 1, placeholder: "no limit" });
  el.instructions = h("textarea", { id: "chat-instructions", rows: 3, placeholder: "You are a helpful assistant." });
  for (const input of [el.temperature, el.maxTokens, el.instructions]) input.addEventListener("change", saveSettings);
  el.messages = h("ol", { class: "messages", "aria-label": "Messages", "aria-live": "polite" });
  el.prompt = h("textarea", {
    id: "chat-prompt",
    rows: 2,
    placeholder: "Message the model (Enter sends, Shift+Enter for a new line)",
    onkeydown: onPromptKey,
  });
  el.send = h("button", { type: "submit", class: "primary" }, "Send");
  el.file = h("input", { type: "file", accept: "image/*", multiple: true, hidden: true, onchange: onFiles });
  el.attach = h(
    "button",
    { type: "button", id: "chat-attach", hidden: true, title: "Attach images", onclick: () => el.file.click() },
    "Attach image",
  );
  el.attached = h("div", { class: "attached", "aria-label": "Attached files" });
  el.prompt.addEventListener("paste", onPaste);
  el.stop = h("button", { type: "button", class: "danger", hidden: true, onclick: stop }, "Stop");
  el.form = h(
    "form",
    { class: "composer", onsubmit: onSubmit, ondragover: onDragOver, ondrop: onDrop },
    h("label", { for: "chat-prompt", class: "visually-hidden" }, "Message"),
    h("div", { class: "composer-input" }, el.attached, el.prompt),
    h("div", { class: "composer-buttons" }, el.file, el.attach, el.send, el.stop),
  );
  replace(
    root,
    h("div", { class: "chat" },
      h("aside", { class: "chat-side" }, el.newChat, el.list),
      h("div", { class: "chat-main" },
        h("div", { class: "chat-toolbar" },
          h("label", { for: "chat-model" }, "Model"), el.model, el.modelState,
          h("details", { class: "chat-settings" },
            h("summary", {}, "Sampling"),
            h("div", { class: "fields" },
              h("label", { for: "chat-temperature" }, "Temperature"), el.temperature,
              h("label", { for: "chat-max-tokens" }, "Max output tokens"), el.maxTokens,
              h("label", { for: "chat-instructions" }, "System prompt"), el.instructions,
            ),
          ),
        ),
        el.messages,
        el.form,
      ),
    ),
  );
}

export async function show() {
  await refreshModels();
  const chat = currentChat() || newChat();
  if (chat.id !== shownChat) await openChat(chat);
  el.prompt.focus();
}

export function hide() {}

async function refreshModels() {
  try {
    const caps = (m) => m.capabilities || [];
    const generates = (m) => caps(m).includes("text") || !(caps(m).includes("embeddings") || caps(m).includes("rerank"));
    const list = (await ctx.api.get("/models")).data.filter((m) => m.state !== "error" && generates(m));
    const rank = { loaded: 0, loading: 1, unloading: 2, available: 3 };
    models = list.sort((a, b) => rank[a.state] - rank[b.state] || a.id.localeCompare(b.id));
  } catch (error) {
    toast(problemText(error), "error");
  }
  const selected = el.model.value;
  replace(
    el.model,
    models.map((m) => h("option", { value: m.id }, m.state === "loaded" ? `${m.id} — loaded` : m.id)),
  );
  if (!models.length) el.model.append(h("option", { value: "" }, "No models found"));
  if (selected && models.some((m) => m.id === selected)) el.model.value = selected;
  describeModel();
}

function describeModel() {
  const model = models.find((m) => m.id === el.model.value);
  if (!model) return (el.modelState.textContent = "");
  const detail = { loaded: "loaded", loading: "loading…", unloading: "unloading…", available: "loads on the first message" };
  const ext = (model.extensions && model.extensions.lmsp_tray) || {};
  const share = model.state === "loading" && ext.load_progress != null ? ` ${Math.round(ext.load_progress * 100)}%` : "";
  const sees = takesImages(model);
  const hears = takesAudio(model);
  const kinds = `${sees ? " · vision" : ""}${hears ? " · audio" : ""}`;
  el.modelState.textContent = `${detail[model.state] || model.state}${share} · ${bytes(model.size_bytes)}${kinds}`;
  el.attach.hidden = !sees && !hears;
  el.file.accept = [sees ? "image/*" : "", hears ? "audio/*" : ""].filter(Boolean).join(",");
  const what = sees && hears ? "images or audio" : sees ? "images" : "audio";
  el.attach.title = `Attach ${what}`;
  el.attach.textContent = sees && hears ? "Attach file" : sees ? "Attach image" : "Attach audio";
  const kept = attached.filter((url) => (isAudio(url) ? hears : sees));
  if (kept.length !== attached.length) setAttached(kept);
}

function modalities(model) {
  const ext = (model && model.extensions && model.extensions.lmsp_tray) || {};
  return ext.input_modalities || [];
}

function takesImages(model) {
  return modalities(model).includes("image");
}

function takesAudio(model) {
  return modalities(model).includes("audio");
}

function isAudio(url) {
  return url.startsWith("data:audio/");
}

// What the service reads an audio file as, from its MIME type (OpenAI's input_audio `format`).
const AUDIO_FORMATS = { "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
  "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/flac": "flac", "audio/x-flac": "flac" };

function audioPart(url) {
  const [head, data] = url.split(",", 2);
  const mime = head.slice(5).split(";")[0];
  return { type: "input_audio", input_audio: { data, format: AUDIO_FORMATS[mime] || "" } };
}

function audioUrl(part) {
  const mime = { wav: "audio/wav", mp3: "audio/mpeg", flac: "audio/flac" }[part.input_audio.format] || "audio/wav";
  return `data:${mime};base64,${part.input_audio.data}`;
}

// -- images --------------------------------------------------------------------------------------
function setAttached(list) {
  attached = list.slice(0, MAX_ATTACHED);
  replace(
    el.attached,
    attached.map((url, i) =>
      h("span", { class: isAudio(url) ? "thumb sound" : "thumb" },
        isAudio(url)
          ? h("audio", { src: url, controls: true, "aria-label": `Attached audio ${i + 1}` })
          : h("img", { src: url, alt: `Attached image ${i + 1}` }),
        h("button", { type: "button", title: "Remove", "aria-label": `Remove ${isAudio(url) ? "audio" : "image"} ${i + 1}`,
          onclick: () => setAttached(attached.filter((_, j) => j !== i)) }, "×"),
      ),
    ),
  );
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function addImages(files) {
  const images = [...files].filter((f) => f.type.startsWith("image/"));
  const sounds = [...files].filter((f) => f.type.startsWith("audio/"));
  if (!images.length && !sounds.length) return false;
  const model = models.find((m) => m.id === el.model.value);
  if (images.length && !takesImages(model)) {
    toast("This model does not take images: choose a model listed with vision.", "error");
    return true;
  }
  if (sounds.length && !takesAudio(model)) {
    toast("This model does not take audio: choose a model listed with audio.", "error");
    return true;
  }
  setAttached([...attached, ...(await Promise.all([...images, ...sounds].map(readImage)))]);
  return true;
}

function onFiles() {
  addImages(el.file.files);
  el.file.value = "";
}

function onPaste(event) {
  const files = event.clipboardData ? event.clipboardData.files : [];
  if (files && files.length && [...files].some((f) => f.type.startsWith("image/"))) {
    event.preventDefault();
    addImages(files);
  }
}

function onDragOver(event) {
  if (event.dataTransfer && [...event.dataTransfer.types].includes("Files")) event.preventDefault();
}

function onDrop(event) {
  if (!event.dataTransfer || !event.dataTransfer.files.length) return;
  event.preventDefault();
  addImages(event.dataTransfer.files);
}

function onModelChange() {
  const chat = currentChat() || newChat();
  chat.model = el.model.value;
  if (chat.turns.length) updateChat(chat);
  describeModel();
}

function saveSettings() {
  const chat = currentChat() || newChat();
  chat.settings = {
    temperature: el.temperature.value === "" ? "" : Number(el.temperature.value),
    max_output_tokens: el.maxTokens.value === "" ? "" : Number(el.maxTokens.value),
    instructions: el.instructions.value,
  };
  updateChat(chat);
  renderList();
}

function renderList() {
  const current = sessionStorage.getItem(CURRENT_KEY);
  replace(
    el.list,
    chats().map((chat) =>
      h("li", { class: chat.id === current ? "current" : "" },
        h("button", {
          type: "button",
          class: "chat-open",
          "aria-current": chat.id === current ? "true" : null,
          onclick: () => openChat(chat),
        }, chat.title),
        h("button", {
          type: "button",
          class: "quiet icon",
          "aria-label": `Delete conversation “${chat.title}”`,
          title: "Delete",
          onclick: () => deleteChat(chat),
        }, "×"),
      ),
    ),
  );
}

async function startNewChat() {
  if (running) stop();
  await openChat(newChat());
  el.prompt.focus();
}

async function openChat(chat) {
  if (running) stop();
  sessionStorage.setItem(CURRENT_KEY, chat.id);
  shownChat = chat.id;
  const settings = { ...DEFAULT_SETTINGS, ...chat.settings };
  el.temperature.value = settings.temperature;
  el.maxTokens.value = settings.max_output_tokens;
  el.instructions.value = settings.instructions;
  if (chat.model && models.some((m) => m.id === chat.model)) el.model.value = chat.model;
  describeModel();
  renderList();
  el.messages.replaceChildren();
  if (!chat.turns.length) {
    el.messages.append(h("li", { class: "empty muted" }, "Ask anything. Answers stream in as the model writes them."));
    return;
  }
  el.messages.setAttribute("aria-busy", "true");
  const turns = await Promise.all(chat.turns.map((id) => loadTurn(id)));
  el.messages.replaceChildren();
  for (const turn of turns) {
    el.messages.append(userMessage(turn.user, turn.images));
    const answer = assistantMessage();
    if (turn.missing) answer.status("This turn is no longer stored on the service.", "warning");
    else {
      answer.thinking(turn.thinking);
      answer.text(turn.text);
      answer.figures({ usage: turn.usage, ...((chat.figures || {})[turn.id] || {}) });
      if (turn.status === "incomplete") answer.status("Stopped at the output limit.", "warning");
    }
    el.messages.append(answer.node);
  }
  el.messages.removeAttribute("aria-busy");
  scrollDown();
}

async function loadTurn(id) {
  try {
    const [response, input] = await Promise.all([
      ctx.api.get(`/responses/${encodeURIComponent(id)}`),
      ctx.api.get(`/responses/${encodeURIComponent(id)}/input_items`),
    ]);
    const users = input.data.filter((item) => item.type === "message" && item.role === "user");
    const user = users
      .map((item) => (typeof item.content === "string" ? item.content : item.content.map((p) => p.text || "").join("")))
      .join("\n");
    const images = users.flatMap((item) =>
      typeof item.content === "string"
        ? []
        : item.content
            .filter((p) => p.type === "input_image" || (p.type === "input_audio" && p.input_audio))
            .map((p) => (p.type === "input_audio" ? audioUrl(p) : p.image_url)),
    );
    const text = response.output
      .filter((item) => item.type === "message")
      .map((item) => item.content.map((p) => p.text || "").join(""))
      .join("\n");
    const thinking = response.output
      .filter((item) => item.type === "reasoning")
      .map((item) => (item.summary || []).map((s) => s.text).join(""))
      .join("\n");
    return { id, user, images, text, thinking, usage: response.usage, status: response.status };
  } catch {
    return { user: "", missing: true };
  }
}

async function deleteChat(chat) {
  if (!confirm(`Delete “${chat.title}”? Its stored turns are deleted from the service too.`)) return;
  for (const id of chat.turns) {
    try {
      await ctx.api.call("DELETE", `/responses/${encodeURIComponent(id)}`);
    } catch {
      // already gone
    }
  }
  saveChats(chats().filter((c) => c.id !== chat.id));
  if (sessionStorage.getItem(CURRENT_KEY) === chat.id) await openChat(newChat());
  else renderList();
}

// -- messages ------------------------------------------------------------------------------------
function userMessage(text, images = []) {
  const pictures = (images || []).filter(Boolean).map((url, i) =>
    isAudio(url)
      ? h("audio", { class: "sent-audio", src: url, controls: true, "aria-label": `Audio ${i + 1}` })
      : h("img", { class: "sent-image", src: url, alt: `Image ${i + 1}` }),
  );
  return h(
    "li",
    { class: "msg user" },
    h("div", { class: "who" }, "You"),
    pictures.length ? h("div", { class: "sent-images" }, ...pictures) : null,
    h("div", { class: "bubble plain" }, text),
  );
}

/** An answer being written: set its thinking, text, figures and status as they come. */
function assistantMessage() {
  const thinkingBody = h("div", { class: "thinking-body" });
  const thinking = h("details", { class: "thinking", hidden: true }, h("summary", {}, "Thinking"), thinkingBody);
  const body = h("div", { class: "bubble markdown" });
  const figures = h("p", { class: "figures muted" });
  const status = h("p", { class: "status", hidden: true });
  const node = h("li", { class: "msg assistant" }, h("div", { class: "who" }, "Model"), thinking, body, figures, status);
  let pending = null;
  return {
    node,
    thinking(text) {
      thinking.hidden = !text;
      thinkingBody.textContent = text || "";
    },
    text(text) {
      // Rendering the whole answer again is cheap at chat sizes; at most once per frame.
      if (pending) return (pending.text = text);
      pending = { text };
      requestAnimationFrame(() => {
        body.replaceChildren(renderMarkdown(pending.text));
        pending = null;
        scrollDown();
      });
    },
    figures({ usage, ttft, tokensPerSecond }) {
      const parts = [];
      if (ttft !== undefined) parts.push(`first token ${ms(ttft)}`);
      if (tokensPerSecond !== undefined) parts.push(rate(tokensPerSecond));
      if (usage) {
        const cached = usage.input_tokens_details && usage.input_tokens_details.cached_tokens;
        parts.push(`${usage.input_tokens} in${cached ? ` (${cached} cached)` : ""}`, `${usage.output_tokens} out`);
      }
      figures.textContent = parts.join(" · ");
    },
    status(text, kind = "info") {
      status.hidden = !text;
      status.textContent = text || "";
      status.className = `status ${kind}`;
    },
  };
}

function scrollDown() {
  const box = el.messages;
  box.scrollTop = box.scrollHeight;
}

// -- sending -------------------------------------------------------------------------------------
function onPromptKey(event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    el.form.requestSubmit();
  } else if (event.key === "Escape" && running) {
    stop();
  }
}

function onSubmit(event) {
  event.preventDefault();
  const text = el.prompt.value.trim();
  if ((!text && !attached.length) || running) return;
  if (!el.model.value) return toast("There is no model to chat with: add one in the Models view.", "error");
  el.prompt.value = "";
  const images = attached;
  setAttached([]);
  send(text, images);
}

function stop() {
  if (running) running.controller.abort();
}

function busy(on) {
  el.send.hidden = on;
  el.stop.hidden = !on;
  el.messages.setAttribute("aria-busy", on ? "true" : "false");
  if (on) el.stop.focus();
  else el.prompt.focus();
}

async function send(text, images = []) {
  const chat = currentChat() || newChat();
  chat.model = el.model.value;
  const settings = { ...DEFAULT_SETTINGS, ...chat.settings };
  const input = images.length
    ? [{ role: "user", content: [
        ...(text ? [{ type: "input_text", text }] : []),
        ...images.map((url) => (isAudio(url) ? audioPart(url) : { type: "input_image", image_url: url })),
      ] }]
    : text;
  const body = { model: chat.model, input, stream: true, store: true };
  if (settings.temperature !== "") body.temperature = Number(settings.temperature);
  if (settings.max_output_tokens !== "") body.max_output_tokens = Number(settings.max_output_tokens);
  if (settings.instructions) body.instructions = settings.instructions;
  if (chat.turns.length) body.previous_response_id = chat.turns[chat.turns.length - 1];

  el.messages.querySelector(".empty")?.remove();
  el.messages.append(userMessage(text, images));
  const answer = assistantMessage();
  el.messages.append(answer.node);
  const model = models.find((m) => m.id === chat.model);
  answer.status(model && model.state !== "loaded" ? `Loading ${chat.model}…` : "Waiting for the model…", "info");
  scrollDown();

  running = { controller: new AbortController() };
  busy(true);
  const started = performance.now();
  let first = null;
  let answerText = "";
  let thinking = "";
  let responseId = null;
  let final = null;
  try {
    for await (const { event, data } of ctx.api.stream("/responses", body, running.controller.signal)) {
      if (event === "response.created") {
        responseId = data.response.id;
        answer.status("");
      } else if (event === "response.output_text.delta" || event === "response.reasoning_summary_text.delta") {
        if (first === null) first = performance.now();
        if (event === "response.output_text.delta") answer.text((answerText += data.delta));
        else answer.thinking((thinking += data.delta));
      } else if (event.startsWith("response.") && data.response && data.response.status !== "in_progress") {
        final = data.response;
      } else if (event === "error") {
        answer.status(data.error.detail || "The stream failed.", "error");
      }
    }
  } catch (error) {
    if (error.name === "AbortError") answer.status("Stopped. This answer is not kept in the conversation.", "warning");
    else answer.status(problemText(error), "error");
  } finally {
    running = null;
    busy(false);
  }
  const ended = performance.now();
  if (final) {
    const out = final.usage ? final.usage.output_tokens : 0;
    const timing = {
      ttft: first === null ? undefined : first - started,
      tokensPerSecond: first !== null && out > 1 && ended > first ? ((out - 1) * 1000) / (ended - first) : undefined,
    };
    answer.figures({ usage: final.usage, ...timing });
    if (final.status === "failed") answer.status((final.error && final.error.detail) || "The answer failed.", "error");
    if (final.status === "incomplete") answer.status("Stopped at the output limit (max output tokens or context).", "warning");
    if (final.status === "completed" || final.status === "incomplete") {
      chat.turns.push(responseId);
      chat.figures = { ...(chat.figures || {}), [responseId]: timing }; // measured here, kept for reopening
      const title = text || (images.some(isAudio) ? "Audio" : "An image");
      if (chat.turns.length === 1) chat.title = title.length > 48 ? `${title.slice(0, 47)}…` : title;
      chat.updated = Date.now();
      updateChat(chat);
      renderList();
    }
  }
  await refreshModels();
}
