// Discover: search Hugging Face for GGUF models, see each repository's variants (size, whether each fits this
// machine, its vision projector) and download one as the service's own download task, with its progress and
// a Cancel (the part fetched is kept: Download again resumes). Nothing is asked of Hugging Face until a search.

import { bytes, count, h, problemText, replace, toast } from "./ui.js";

/** The Discover panel; `done()` runs when a download has finished (the model is listed then). */
export function discoverPanel(ctx, done) {
  const input = h("input", { id: "discover-search", type: "search", placeholder: "e.g. gemma, qwen, llama", "aria-describedby": "discover-help" });
  const results = h("div", { class: "discover-results", "aria-live": "polite" });
  const go = h("button", { type: "submit", class: "primary" }, "Search");
  const form = h("form", { class: "discover-form" },
    h("label", { for: "discover-search" }, "Search Hugging Face"), input, go);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text) return;
    replace(results, h("p", { class: "muted" }, "Searching…"));
    try {
      const found = await ctx.api.get(`/hub/models?search=${encodeURIComponent(text)}`);
      replace(results, found.data.length ? found.data.map((repo) => result(ctx, repo, done)) : h("p", { class: "empty" }, "No GGUF repositories found."));
    } catch (error) {
      replace(results, h("p", { class: "problem" }, problemText(error)));
    }
  });
  return h("details", { class: "discover card" },
    h("summary", {}, "Discover models on Hugging Face"),
    h("p", { class: "muted", id: "discover-help" }, "GGUF repositories, most downloaded first. Nothing is sent to Hugging Face until you search."),
    form, results);
}

function result(ctx, repo, done) {
  const variants = h("div", { class: "variants" });
  const show = h("button", { type: "button", class: "quiet" }, "Show variants");
  show.addEventListener("click", async () => {
    show.disabled = true;
    replace(variants, h("p", { class: "muted" }, "Reading the repository…"));
    try {
      const listing = await ctx.api.get(`/hub/variants?repository=${encodeURIComponent(repo.repository)}`);
      replace(variants,
        listing.projector ? h("p", { class: "muted" }, `Vision projector: ${listing.projector} (downloaded with it)`) : null,
        h("ul", { class: "variant-list" }, listing.variants.map((v) => variantRow(ctx, v, listing.default, done))));
    } catch (error) {
      replace(variants, h("p", { class: "problem" }, problemText(error)));
      show.disabled = false;
    }
  });
  const updated = repo.updated_at ? new Date(repo.updated_at).toLocaleDateString() : "–";
  return h("article", { class: "hub-repo", "aria-label": repo.repository },
    h("h3", {}, repo.repository),
    h("p", { class: "muted" }, `${count(repo.downloads || 0, "download")} · ${count(repo.likes || 0, "like")} · updated ${updated}`),
    show, variants);
}

function variantRow(ctx, v, defaultLabel, done) {
  const fit = v.fit ? v.fit.summary : "fit unknown";
  const status = h("span", { class: "muted" });
  const progress = h("progress", { max: 1, hidden: true, "aria-label": `Downloading ${v.label}` });
  const download = h("button", { type: "button", class: "primary", disabled: !v.runnable }, "Download");
  const cancel = h("button", { type: "button", class: "quiet", hidden: true }, "Cancel");
  let taskId = null;
  download.addEventListener("click", async () => {
    download.disabled = true;
    try {
      const task = await ctx.api.post("/models/pull", { model: v.model });
      taskId = task.id;
      cancel.hidden = false;
      progress.hidden = false;
      await follow(ctx, taskId, progress, status);
      const end = await ctx.api.get(`/tasks/${taskId}`);
      if (end.status === "completed") {
        toast(`Downloaded ${end.download.model_id || v.model}.`);
        status.textContent = "Downloaded";
        done();
      } else {
        status.textContent = end.status === "cancelled" ? "Cancelled (the part fetched is kept; Download resumes)" : problemText({ problem: end.error || {} });
        download.disabled = false;
      }
    } catch (error) {
      toast(problemText(error), "error");
      download.disabled = false;
    } finally {
      cancel.hidden = true;
      progress.hidden = true;
    }
  });
  cancel.addEventListener("click", async () => {
    if (taskId) await ctx.api.post(`/tasks/${taskId}/cancel`).catch((error) => toast(problemText(error), "error"));
  });
  return h("li", { class: "variant", "aria-label": v.label },
    h("strong", {}, v.label + (v.label === defaultLabel ? " (default)" : "")),
    h("span", {}, ` ${bytes(v.size_bytes)} · ${fit} `),
    download, cancel, progress, status);
}

/** Poll the download task until it ends, showing its progress. */
async function follow(ctx, taskId, progress, status) {
  for (;;) {
    const task = await ctx.api.get(`/tasks/${taskId}`);
    const p = task.download && task.download.progress;
    if (p && p.bytes_total) {
      progress.value = p.bytes_done / p.bytes_total;
      status.textContent = `${bytes(p.bytes_done)} of ${bytes(p.bytes_total)}`;
    }
    if (["completed", "failed", "cancelled"].includes(task.status)) return;
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
}
