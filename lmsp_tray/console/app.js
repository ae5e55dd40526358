// The console's start: trade the single-use code in the URL fragment for the console's token, then show
// the views. The code leaves the address bar (and the history) before anything else happens; the token
// lives in this tab's sessionStorage, which no other origin (another port included) can read.

import { Api } from "./api.js";
import * as activity from "./activity.js";
import * as apps from "./apps.js";
import * as chat from "./chat.js";
import * as models from "./models.js";
import * as settings from "./settings.js";
import { toast } from "./ui.js";

const SESSION_KEY = "lmsp-tray.console.session";
const VIEWS = { chat, models, apps, activity, settings };
const mounted = new Set();
let current = null;

async function exchange(code) {
  const response = await fetch("/lmsp/v1/console/sessions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ code }),
    credentials: "omit",
    cache: "no-store",
  });
  const doc = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(doc.detail || `The service answered ${response.status}.`);
  const session = { token: doc.token, tokenId: doc.token_id };
  sessionStorage.setItem(SESSION_KEY, JSON.stringify(session));
  return session;
}

function storedSession() {
  try {
    return JSON.parse(sessionStorage.getItem(SESSION_KEY) || "null");
  } catch {
    return null;
  }
}

function signIn(reason) {
  sessionStorage.removeItem(SESSION_KEY);
  for (const view of Object.keys(VIEWS)) document.getElementById(`view-${view}`).hidden = true;
  document.getElementById("nav").hidden = true;
  document.getElementById("session").hidden = true;
  const why = document.getElementById("signin-reason");
  why.textContent = reason || "";
  why.hidden = !reason;
  document.getElementById("signin").hidden = false;
  if (current && VIEWS[current].hide) VIEWS[current].hide();
  current = null;
}

function show(name, ctx) {
  if (!VIEWS[name]) name = "chat";
  if (current === name) return;
  if (current && VIEWS[current].hide) VIEWS[current].hide();
  for (const view of Object.keys(VIEWS)) document.getElementById(`view-${view}`).hidden = view !== name;
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.view === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  const root = document.getElementById(`view-${name}`);
  if (!mounted.has(name)) {
    VIEWS[name].mount(root, ctx);
    mounted.add(name);
  }
  current = name;
  VIEWS[name].show();
  document.title = `${root.getAttribute("aria-label")} — lmsp-tray`;
}

async function start() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const code = fragment.get("code");
  let session = storedSession();
  if (code) {
    history.replaceState(null, "", location.pathname); // the code never stays in the address bar
    try {
      session = await exchange(code);
    } catch (error) {
      if (!session) return signIn(error.message);
      toast(error.message, "error");
    }
  }
  if (!session) return signIn();

  const api = new Api(session.token, (problem) =>
    signIn(`This console was signed out: ${problem.detail || "its token is no longer valid."}`),
  );
  const ctx = { api, session, navigate: (view) => (location.hash = view) };
  document.getElementById("signin").hidden = true;
  document.getElementById("nav").hidden = false;
  document.getElementById("session").hidden = false;
  document.getElementById("sign-out").addEventListener("click", () => {
    signIn("Signed out of this tab. Open the console again from the tray when you need it.");
  });
  try {
    const service = await api.get("");
    ctx.service = service;
    document.getElementById("service-status").textContent = `${service.service.name} ${service.service.version}`;
  } catch {
    return; // a 401 has already shown the sign-in page
  }
  const route = () => show(location.hash.replace(/^#/, "") || "chat", ctx);
  window.addEventListener("hashchange", route);
  route();
}

start();
