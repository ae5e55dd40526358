// Apps and tokens: every token (name, scopes, created, last used), create one (its secret shown once,
// with a copy button), revoke; pairing requests from apps waiting for an answer, approve or deny.

import { ago, copyText, count, every, h, problemText, replace, toast, when } from "./ui.js";

const OWNER = "lmsp-tray owner";
const SCOPE_HELP = {
  "models:read": "see the models",
  "models:manage": "load and unload models",
  "responses:create": "generate answers",
  "responses:read": "read stored answers",
  "tasks:create": "start background tasks",
  "tasks:read": "read background tasks",
  "tokens:manage": "manage tokens and pairings (full control)",
  "activity:read": "see activity and the service log",
  "settings:manage": "change settings",
};

let ctx;
let el = {};
let stopPolling = null;
let lastPairings = "";

export function mount(root, context) {
  ctx = context;
  const scopes = (ctx.service && ctx.service.auth.scopes) || Object.keys(SCOPE_HELP);
  el.pairings = h("section", { class: "pairings", hidden: true, "aria-labelledby": "pairings-title" });
  el.name = h("input", { id: "token-name", required: true, maxlength: 64, autocomplete: "off", placeholder: "my-app" });
  el.scopes = h("fieldset", { class: "scopes" },
    h("legend", {}, "Scopes"),
    scopes.map((scope) =>
      h("label", { class: "check" },
        h("input", { type: "checkbox", name: "scope", value: scope, checked: scope === "models:read" || scope === "responses:create" }),
        h("code", {}, scope), h("span", { class: "muted" }, ` ${SCOPE_HELP[scope] || ""}`),
      ),
    ),
  );
  el.created = h("div", { class: "secret", hidden: true, role: "region", "aria-label": "New token" });
  el.form = h("form", { class: "create-token", onsubmit: create },
    h("h2", {}, "Create a token"),
    h("label", { for: "token-name" }, "Name"), el.name,
    el.scopes,
    h("button", { type: "submit", class: "primary" }, "Create token"),
  );
  el.tokens = h("tbody");
  replace(
    root,
    h("div", { class: "page" },
      h("div", { class: "page-head" }, h("h1", {}, "Apps and tokens"),
        h("p", { class: "muted" }, "Each app uses its own token. Revoking one refuses its very next request.")),
      el.pairings,
      el.created,
      h("section", { "aria-labelledby": "tokens-title" },
        h("h2", { id: "tokens-title" }, "Tokens"),
        h("div", { class: "table-wrap" },
          h("table", { class: "tokens" },
            h("thead", {}, h("tr", {}, ["Name", "Scopes", "Created", "Last used", ""].map((t) => h("th", { scope: "col" }, t)))),
            el.tokens,
          ),
        ),
      ),
      el.form,
    ),
  );
}

export async function show() {
  await Promise.all([refreshTokens(), refreshPairings()]);
  stopPolling = every(2, refreshPairings);
}

export function hide() {
  if (stopPolling) stopPolling();
  stopPolling = null;
  el.created.replaceChildren(); // a new secret is not left behind in the page
  el.created.hidden = true;
}

async function refreshTokens() {
  let tokens;
  try {
    tokens = (await ctx.api.get("/auth/tokens")).data;
  } catch (error) {
    return toast(problemText(error), "error");
  }
  tokens.sort((a, b) => Boolean(a.revoked_at) - Boolean(b.revoked_at) || b.created_at - a.created_at);
  replace(el.tokens, tokens.map(row));
}

function row(token) {
  const badges = [];
  if (token.owner || token.name === OWNER) badges.push(h("span", { class: "badge loaded" }, "owner"));
  if (token.id === ctx.session.tokenId) badges.push(h("span", { class: "badge loading" }, "this console"));
  if (token.revoked_at) badges.push(h("span", { class: "badge error" }, "revoked"));
  const revoke = token.revoked_at || token.owner
    ? null
    : h("button", { type: "button", class: "danger quiet", onclick: () => revokeToken(token), "aria-label": `Revoke ${token.name}` }, "Revoke");
  return h("tr", { class: token.revoked_at ? "revoked" : "" },
    h("th", { scope: "row" }, h("span", { class: "token-name" }, token.name), " ", badges, h("div", { class: "muted small" }, token.id)),
    h("td", {}, h("ul", { class: "chips" }, token.scopes.map((s) => h("li", {}, s)))),
    h("td", {}, when(token.created_at)),
    h("td", {}, token.revoked_at ? `revoked ${ago(token.revoked_at)}` : ago(token.last_used_at)),
    h("td", {}, revoke),
  );
}

async function create(event) {
  event.preventDefault();
  const scopes = [...el.scopes.querySelectorAll("input:checked")].map((i) => i.value);
  if (!scopes.length) return toast("Choose at least one scope.", "error");
  let doc;
  try {
    doc = await ctx.api.post("/auth/tokens", { name: el.name.value.trim(), scopes });
  } catch (error) {
    return toast(problemText(error), "error");
  }
  el.name.value = "";
  showSecret(doc);
  await refreshTokens();
}

function showSecret(doc) {
  const secret = h("input", { id: "new-secret", readonly: true, value: doc.secret, spellcheck: "false", "aria-label": "Secret" });
  const copy = h("button", { type: "button", class: "primary" }, "Copy");
  copy.addEventListener("click", () => copyText(secret.value, copy));
  const done = h("button", { type: "button", class: "quiet" }, "Done");
  done.addEventListener("click", () => {
    secret.value = "";
    el.created.replaceChildren();
    el.created.hidden = true;
  });
  replace(
    el.created,
    h("h2", {}, `Token “${doc.name}” created`),
    h("p", {}, "Copy its secret now: this is the only time it is shown."),
    h("div", { class: "secret-row" }, secret, copy, done),
    doc.in_keyring ? null : h("p", { class: "warning" }, "The secret could not be saved in the OS keyring."),
  );
  el.created.hidden = false;
  secret.select();
  copy.focus();
}

async function revokeToken(token) {
  const mine = token.id === ctx.session.tokenId;
  const question = mine
    ? "This is this console's own token: revoking it signs every console out. Revoke it?"
    : `Revoke “${token.name}”? The app using it is refused from its next request on.`;
  if (!confirm(question)) return;
  try {
    await ctx.api.post(`/auth/tokens/${encodeURIComponent(token.id)}/revoke`);
    toast(`Revoked ${token.name}.`);
  } catch (error) {
    return toast(problemText(error), "error");
  }
  await refreshTokens();
}

async function refreshPairings() {
  let pending;
  try {
    pending = (await ctx.api.get("/auth/pairings")).data;
  } catch {
    return;
  }
  const key = JSON.stringify(pending.map((p) => p.id));
  if (key === lastPairings) return;
  lastPairings = key;
  el.pairings.hidden = !pending.length;
  replace(
    el.pairings,
    h("h2", { id: "pairings-title" }, `${count(pending.length, "app")} asking for a token`),
    h("p", { class: "muted" }, "Approve only if the app shows the same code."),
    h("ul", { class: "pairing-list" },
      pending.map((p) =>
        h("li", { class: "card pairing", "aria-label": `Pairing request from ${p.app_name}` },
          h("p", {}, h("strong", {}, p.app_name), " asks for ", h("span", { class: "chips inline" }, p.scopes.map((s) => h("code", {}, s)))),
          h("p", { class: "code-line" }, "Code ", h("span", { class: "user-code" }, p.user_code)),
          h("p", { class: "muted small" }, `Expires ${when(p.expires_at)}`),
          h("div", { class: "actions" },
            h("button", { type: "button", class: "primary", onclick: () => answer(p, "approve"), "aria-label": `Approve ${p.app_name}` }, "Approve"),
            h("button", { type: "button", class: "danger", onclick: () => answer(p, "deny"), "aria-label": `Deny ${p.app_name}` }, "Deny"),
          ),
        ),
      ),
    ),
  );
}

async function answer(pairing, action) {
  try {
    await ctx.api.post(`/auth/pairings/${encodeURIComponent(pairing.id)}/${action}`);
    toast(action === "approve" ? `Approved ${pairing.app_name}.` : `Denied ${pairing.app_name}.`);
  } catch (error) {
    toast(problemText(error), "error");
  }
  lastPairings = "";
  await Promise.all([refreshPairings(), refreshTokens()]);
}
