// The console's API client: every call carries the console's own token as a bearer header (never a
// cookie), and problem documents become ApiError. `stream` reads a response's server-sent events.

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.problem = problem || {};
  }
}

async function problemOf(response) {
  try {
    return await response.json();
  } catch {
    return { detail: `${response.status} ${response.statusText}` };
  }
}

export class Api {
  /** `onUnauthorized(problem)` runs when the token is refused (revoked, or the service forgot it). */
  constructor(token, onUnauthorized) {
    this.token = token;
    this.onUnauthorized = onUnauthorized;
  }

  async fetch(method, path, body, signal) {
    const headers = { Authorization: `Bearer ${this.token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(`/lmsp/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "omit",
      cache: "no-store",
      signal,
    });
    if (!response.ok) {
      const problem = await problemOf(response);
      if (response.status === 401) this.onUnauthorized(problem);
      throw new ApiError(response.status, problem);
    }
    return response;
  }

  async call(method, path, body) {
    const response = await this.fetch(method, path, body);
    return response.status === 204 ? null : response.json();
  }

  get(path) {
    return this.call("GET", path);
  }

  post(path, body) {
    return this.call("POST", path, body);
  }

  /** Yields {event, data} for each server-sent event of a streamed POST; abort with `signal`. */
  async *stream(path, body, signal) {
    const response = await this.fetch("POST", path, body, signal);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
        const event = parseEvent(block);
        if (event) yield event;
      }
    }
  }
}

function parseEvent(block) {
  let name = "message";
  const data = [];
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith(":")) continue; // keep-alive comment
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  return { event: name, data: JSON.parse(data.join("\n")) };
}

/** `/models/{id}` with the id made safe for a path. */
export function modelPath(id, action = "") {
  return `/models/${encodeURIComponent(id)}${action ? `/${action}` : ""}`;
}
