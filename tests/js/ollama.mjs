// Ollama's official JavaScript client (npm `ollama`) against the service's Ollama-compatible API.
// Run by tests/e2e/test_ollama_js.py with OLLAMA_HOST (the service's root URL, or its second listener on
// Ollama's port), LMSP_TOKEN, LMSP_MODEL and LMSP_EMBED_MODEL; prints one JSON object of what each case
// saw, and exits non-zero on an unexpected failure.
import { Ollama } from "ollama";

const ollama = new Ollama({
  host: process.env.OLLAMA_HOST,
  headers: { Authorization: `Bearer ${process.env.LMSP_TOKEN}` },
});
const model = process.env.LMSP_MODEL;
const options = { temperature: 0, num_predict: 8 };
const messages = [{ role: "user", content: "hello there" }];
const seen = {};

const listed = await ollama.list();
seen.list = listed.models.map((m) => ({ name: m.name, model: m.model, format: m.details?.format }));

const whole = await ollama.chat({ model, messages, options, stream: false });
seen.chat = {
  role: whole.message.role,
  content: whole.message.content,
  done: whole.done,
  done_reason: whole.done_reason,
  eval_count: whole.eval_count,
};
let streamed = "";
let parts = 0;
let last = null;
for await (const part of await ollama.chat({ model, messages, options, stream: true })) {
  streamed += part.message.content;
  parts += 1;
  last = part;
}
seen.chat_stream = { content: streamed, parts, done: last.done, done_reason: last.done_reason, eval_count: last.eval_count };

const generated = await ollama.generate({ model, prompt: "hello", options });
seen.generate = { response: generated.response, done: generated.done, eval_count: generated.eval_count };

const embedded = await ollama.embed({ model: process.env.LMSP_EMBED_MODEL, input: ["one", "two"] });
seen.embed = { count: embedded.embeddings.length, dims: embedded.embeddings.map((e) => e.length) };

try {
  await ollama.chat({ model: "no-such-model:latest", messages });
  seen.error = null;
} catch (err) {
  seen.error = { name: err.name, status: err.status_code, message: err.error ?? err.message };
}

try {
  await new Ollama({ host: process.env.OLLAMA_HOST }).list(); // no key: refused unless keyless_scopes allow it
  seen.keyless = null;
} catch (err) {
  seen.keyless = { name: err.name, status: err.status_code, message: err.error ?? err.message };
}

console.log(JSON.stringify(seen));
