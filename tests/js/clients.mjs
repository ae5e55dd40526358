// The JavaScript clients against /v1/responses: the official openai SDK and the Vercel AI SDK.
// Run by tests/test_openai_js.py with LMSP_BASE (…/v1), LMSP_TOKEN and LMSP_MODEL; prints one JSON
// object of what each case saw, and exits non-zero on an unexpected failure.
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const baseURL = process.env.LMSP_BASE;
const apiKey = process.env.LMSP_TOKEN;
const model = process.env.LMSP_MODEL;
const seen = {};

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const sync = await client.responses.create({ model, input: "Say hi", max_output_tokens: 5 });
seen.sdk_sync = { id: sync.id, status: sync.status, text: sync.output_text, store: sync.store };
const events = [];
let text = "";
const stream = await client.responses.create({ model, input: "Say hi", max_output_tokens: 5, stream: true });
for await (const event of stream) {
  events.push(event.type);
  if (event.type === "response.output_text.delta") text += event.delta;
}
seen.sdk_stream = { first: events[0], last: events.at(-1), text };
const again = await client.responses.retrieve(sync.id);
const items = await client.responses.inputItems.list(sync.id);
seen.sdk_stored = { id: again.id, items: items.data.map((i) => i.content[0].text) };
try {
  await client.responses.create({ model: "no-such-model", input: "hi" });
  seen.sdk_error = null;
} catch (err) {
  seen.sdk_error = { name: err.constructor.name, status: err.status, code: err.code, message: err.message };
}

const provider = createOpenAI({ baseURL, apiKey });
const generated = await generateText({ model: provider.responses(model), prompt: "Say hi", maxOutputTokens: 5 });
seen.ai_generate = { text: generated.text, finishReason: generated.finishReason };
const streamed = streamText({ model: provider.responses(model), prompt: "Say hi", maxOutputTokens: 5 });
let pieces = "";
for await (const piece of streamed.textStream) pieces += piece;
seen.ai_stream = { text: pieces, finishReason: await streamed.finishReason };

console.log(JSON.stringify(seen));
