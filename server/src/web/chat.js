// xdna-vl web chat: one page over the server's own POST /v1/chat/completions, streamed as
// server-sent events. The whole conversation is sent each turn (as OpenAI clients do), pictures
// as data:image/...;base64, URLs. Nothing is fetched from anywhere but this server.
"use strict";

const KEY_STORE = "xdna-vl.api-key";
// What the server's image decoder reads.
const ACCEPTED = ["image/png", "image/jpeg", "image/webp", "image/gif"];

const $ = (id) => document.getElementById(id);
const ui = {
  log: $("log"),
  empty: $("empty"),
  form: $("composer"),
  prompt: $("prompt"),
  send: $("send"),
  stop: $("stop"),
  attach: $("attach"),
  file: $("file"),
  attachments: $("attachments"),
  notice: $("notice"),
  status: $("status"),
  model: $("model"),
  newChat: $("new-chat"),
  keyButton: $("key-button"),
  keyDialog: $("key-dialog"),
  keyForm: $("key-form"),
  keyInput: $("key-input"),
  keyMessage: $("key-message"),
  keyCancel: $("key-cancel"),
  dropOverlay: $("drop-overlay"),
};

const state = {
  history: [], // the OpenAI messages of this conversation: user turns (with pictures), answers
  pending: [], // pictures attached to the next message: {name, url}
  controller: null, // the AbortController of the answer being streamed
  model: null,
  needsKey: false,
};

// ---- the key (only when the server has --api-key) ----

function apiKey() {
  return sessionStorage.getItem(KEY_STORE);
}

function requestHeaders() {
  const h = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

function askForKey(message) {
  ui.keyMessage.textContent = message || "";
  ui.keyInput.value = "";
  if (!ui.keyDialog.open) ui.keyDialog.showModal();
  ui.keyInput.focus();
}

// Asks the server which model it serves; a 401 means it wants a key.
async function connect() {
  let r;
  try {
    r = await fetch("/v1/models", { headers: requestHeaders() });
  } catch (e) {
    setStatus("The server cannot be reached (" + e.message + "). Is xdna-vl serve running?");
    return false;
  }
  if (r.status === 401) {
    state.needsKey = true;
    ui.keyButton.hidden = false;
    askForKey(apiKey() ? "The server refused this key." : "");
    if (apiKey()) sessionStorage.removeItem(KEY_STORE);
    return false;
  }
  if (!r.ok) {
    setStatus(describeError(r.status, await errorBody(r)));
    return false;
  }
  const list = await r.json().catch(() => null);
  state.model = (list && list.data && list.data[0] && list.data[0].id) || null;
  ui.model.textContent = state.model ? "· " + state.model : "";
  setStatus("");
  return true;
}

ui.keyForm.addEventListener("submit", async (e) => {
  e.preventDefault();
  const key = ui.keyInput.value.trim();
  if (!key) {
    ui.keyMessage.textContent = "Enter the key the server was started with (--api-key).";
    return;
  }
  sessionStorage.setItem(KEY_STORE, key);
  ui.keyMessage.textContent = "Checking…";
  if (await connect()) {
    ui.keyMessage.textContent = "";
    ui.keyDialog.close();
    ui.prompt.focus();
  }
});
ui.keyCancel.addEventListener("click", () => ui.keyDialog.close());
ui.keyButton.addEventListener("click", () => askForKey(""));

// ---- pictures: file picker, drop, paste ----

function readAsDataURL(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function attach(files) {
  const refused = [];
  for (const file of files) {
    if (!ACCEPTED.includes(file.type)) {
      refused.push((file.name || "the pasted item") + " (" + (file.type || "unknown type") + ")");
      continue;
    }
    try {
      state.pending.push({ name: file.name || "pasted picture", url: await readAsDataURL(file) });
    } catch (err) {
      refused.push((file.name || "the pasted item") + " (" + err.message + ")");
    }
  }
  ui.notice.textContent = refused.length
    ? "Not added: " + refused.join(", ") + ". The server reads PNG, JPEG, WebP and GIF pictures."
    : "";
  renderAttachments();
}

function renderAttachments() {
  ui.attachments.replaceChildren(
    ...state.pending.map((p, i) => {
      const li = document.createElement("li");
      const img = document.createElement("img");
      img.src = p.url;
      img.alt = p.name;
      const remove = document.createElement("button");
      remove.type = "button";
      remove.textContent = "×";
      remove.setAttribute("aria-label", "Remove " + p.name);
      remove.addEventListener("click", () => {
        state.pending.splice(i, 1);
        renderAttachments();
        ui.prompt.focus();
      });
      li.append(img, remove);
      return li;
    })
  );
}

ui.attach.addEventListener("click", () => ui.file.click());
ui.file.addEventListener("change", async () => {
  await attach(Array.from(ui.file.files));
  ui.file.value = "";
  ui.prompt.focus();
});

let dragDepth = 0;
const carriesFiles = (e) => e.dataTransfer && Array.from(e.dataTransfer.types).includes("Files");
window.addEventListener("dragenter", (e) => {
  if (!carriesFiles(e)) return;
  dragDepth++;
  ui.dropOverlay.hidden = false;
});
window.addEventListener("dragleave", () => {
  dragDepth = Math.max(0, dragDepth - 1);
  if (dragDepth === 0) ui.dropOverlay.hidden = true;
});
window.addEventListener("dragover", (e) => {
  if (!carriesFiles(e)) return;
  e.preventDefault();
  e.dataTransfer.dropEffect = "copy";
});
window.addEventListener("drop", (e) => {
  dragDepth = 0;
  ui.dropOverlay.hidden = true;
  if (!e.dataTransfer || !e.dataTransfer.files.length) return;
  e.preventDefault();
  attach(Array.from(e.dataTransfer.files));
  ui.prompt.focus();
});
document.addEventListener("paste", (e) => {
  const files = e.clipboardData ? Array.from(e.clipboardData.files) : [];
  if (!files.length) return; // text pastes as usual
  e.preventDefault();
  attach(files);
});

// ---- the conversation ----

function setStatus(text) {
  ui.status.textContent = text;
}

function scrollToEnd(force) {
  const log = ui.log;
  if (force || log.scrollHeight - log.scrollTop - log.clientHeight < 80) {
    log.scrollTop = log.scrollHeight;
  }
}

// Adds a message to the page: {article, text, meta}.
function addMessage(role, text, pictures) {
  ui.empty.hidden = true;
  const article = document.createElement("article");
  article.className = "msg " + role;
  const who = document.createElement("p");
  who.className = "who";
  who.textContent = role === "user" ? "You" : state.model || "xdna-vl";
  article.append(who);
  if (pictures.length) {
    const row = document.createElement("div");
    row.className = "pictures";
    for (const p of pictures) {
      const img = document.createElement("img");
      img.src = p.url;
      img.alt = p.name;
      row.append(img);
    }
    article.append(row);
  }
  const bubble = document.createElement("div");
  bubble.className = "bubble";
  const body = document.createElement("span");
  body.className = "text";
  body.textContent = text;
  bubble.append(body);
  if (role === "user" && !text) bubble.hidden = true;
  article.append(bubble);
  const meta = document.createElement("p");
  meta.className = "meta";
  article.append(meta);
  ui.log.append(article);
  scrollToEnd(true);
  return { article, bubble, text: body, meta };
}

// A thinking model's reasoning, collapsed above the answer's text (made when the first piece
// of it comes).
function thinkingBox(view) {
  if (!view.thinking) {
    const box = document.createElement("details");
    box.className = "thinking";
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    box.append(summary, text);
    view.bubble.prepend(box);
    view.thinking = text;
  }
  return view.thinking;
}

function showError(view, title, detail) {
  const box = document.createElement("div");
  box.className = "error";
  box.setAttribute("role", "alert");
  const strong = document.createElement("strong");
  strong.textContent = title;
  box.append(strong, document.createTextNode(detail ? "\n" + detail : ""));
  view.article.append(box);
  scrollToEnd(true);
}

async function errorBody(r) {
  const text = await r.text().catch(() => "");
  try {
    const j = JSON.parse(text);
    if (j && j.error) return j.error;
  } catch (_) {
    // not JSON: shown as it is
  }
  return { message: text.slice(0, 600) || r.statusText || "no details" };
}

function describeError(status, error) {
  const field = error.param ? " (field " + error.param + ")" : "";
  return "Error " + status + field + ": " + (error.message || "no details");
}

const STATUS_TITLES = {
  400: "The server refused the request",
  401: "The server wants the API key",
  404: "The server has no such route",
  413: "The request is too large for the server",
  500: "The server failed on this request",
  503: "The server is busy",
};

function seconds(ms) {
  return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
}

// The line under an answer. The server streams token counts (usage) but no timings, so the
// times are measured here, from sending the request to the first and the last piece.
function timingsLine(t) {
  const parts = [];
  if (t.usage) {
    parts.push(t.usage.prompt_tokens + " prompt + " + t.usage.completion_tokens + " answer tokens");
  }
  if (t.first !== null) parts.push("first token " + seconds(t.first - t.start));
  parts.push(seconds(t.end - t.start) + " in all");
  if (t.usage && t.first !== null && t.usage.completion_tokens > 1 && t.end > t.first) {
    const rate = (t.usage.completion_tokens - 1) / ((t.end - t.first) / 1000);
    parts.push(rate.toFixed(1) + " tok/s");
  }
  if (t.finish === "length") parts.push("cut at the token limit");
  return parts.join(" · ") + " (times measured in this page)";
}

// Reads server-sent events, calling onData with each JSON payload; true when [DONE] came.
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return false;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return true;
      onData(JSON.parse(data));
    }
  }
}

class ServerError extends Error {
  constructor(status, error) {
    super(error.message || "no details");
    this.status = status;
    this.error = error;
  }
}

function setBusy(busy) {
  ui.send.hidden = busy;
  ui.stop.hidden = !busy;
}

async function send() {
  if (state.controller) {
    setStatus("An answer is still coming: wait for it or stop it (Esc).");
    return;
  }
  const text = ui.prompt.value.trim();
  const pictures = state.pending.slice();
  if (!text && !pictures.length) {
    ui.prompt.focus();
    return;
  }
  const content = pictures.map((p) => ({ type: "image_url", image_url: { url: p.url } }));
  if (text) content.push({ type: "text", text });
  state.history.push({ role: "user", content });
  const asked = addMessage("user", text, pictures);
  ui.prompt.value = "";
  state.pending = [];
  ui.notice.textContent = "";
  renderAttachments();
  fitPrompt();

  const answer = addMessage("assistant", "", []);
  answer.article.setAttribute("aria-busy", "true");
  const controller = new AbortController();
  state.controller = controller;
  setBusy(true);
  setStatus("Waiting for the answer…");
  const t = { start: performance.now(), first: null, end: 0, usage: null, finish: null };
  let reply = "";
  let reasoning = "";
  let failure = null;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: requestHeaders(),
      body: JSON.stringify({
        model: state.model || undefined,
        messages: state.history,
        stream: true,
        stream_options: { include_usage: true },
      }),
      signal: controller.signal,
    });
    if (!r.ok) throw new ServerError(r.status, await errorBody(r));
    setStatus("Answering…");
    const finished = await readEvents(r.body, (chunk) => {
      if (chunk.error) throw new ServerError(Number(chunk.error.code) || 500, chunk.error);
      const choice = chunk.choices && chunk.choices[0];
      if (choice) {
        const thought = choice.delta && choice.delta.reasoning_content;
        if (thought) {
          if (t.first === null) t.first = performance.now();
          reasoning += thought;
          thinkingBox(answer).textContent = reasoning;
          scrollToEnd(false);
        }
        const piece = choice.delta && choice.delta.content;
        if (piece) {
          if (t.first === null) t.first = performance.now();
          reply += piece;
          answer.text.textContent = reply;
          scrollToEnd(false);
        }
        if (choice.finish_reason) t.finish = choice.finish_reason;
      }
      if (chunk.usage) t.usage = chunk.usage;
    });
    if (!finished) throw new ServerError(0, { message: "the answer stream ended before [DONE]" });
  } catch (e) {
    failure = e;
  }
  t.end = performance.now();
  state.controller = null;
  answer.article.setAttribute("aria-busy", "false");
  setBusy(false);

  // The reasoning goes back with the answer, for templates that render it (Qwen3.5's).
  const said = reasoning ? { role: "assistant", content: reply, reasoning_content: reasoning }
    : { role: "assistant", content: reply };
  if (!failure) {
    state.history.push(said);
    answer.meta.textContent = timingsLine(t);
    setStatus("");
  } else if (failure.name === "AbortError" && (reply || reasoning)) {
    // Stopped mid-answer: the part shown stays in the conversation.
    state.history.push(said);
    answer.meta.textContent = "stopped after " + seconds(t.end - t.start) + " (times measured in this page)";
    setStatus("Stopped.");
  } else {
    // Nothing (or a failed answer) came back: this turn is taken out of the conversation and
    // its text and pictures are put back in the box, to edit and send again.
    state.history.pop();
    asked.article.classList.add("unsent");
    if (!reply && !reasoning) answer.article.remove();
    if (failure.name === "AbortError") {
      asked.meta.textContent = "stopped before the answer began; not part of the conversation";
      setStatus("Stopped.");
    } else if (failure instanceof ServerError) {
      const title = failure.status
        ? (STATUS_TITLES[failure.status] || "The server answered with an error") + " (" + failure.status + ")"
        : "The answer did not finish";
      const field = failure.error.param ? "\nField: " + failure.error.param : "";
      const retry = failure.status === 503 ? "\nTry again in a moment." : "";
      showError(asked, title, failure.message + field + retry);
      setStatus("");
      if (failure.status === 401) askForKey("The server refused the key; enter it again.");
    } else {
      showError(asked, "The server cannot be reached", failure.message);
      setStatus("");
    }
    if (!ui.prompt.value) ui.prompt.value = text;
    if (!state.pending.length) {
      state.pending = pictures;
      renderAttachments();
    }
    fitPrompt();
  }
  ui.prompt.focus();
}

function stop() {
  if (state.controller) state.controller.abort();
}

function newChat() {
  stop();
  state.history = [];
  ui.log.querySelectorAll(".msg").forEach((m) => m.remove());
  ui.empty.hidden = false;
  setStatus("");
  ui.prompt.focus();
}

function fitPrompt() {
  ui.prompt.style.height = "auto";
  ui.prompt.style.height = Math.min(ui.prompt.scrollHeight + 2, 192) + "px";
}

ui.form.addEventListener("submit", (e) => {
  e.preventDefault();
  send();
});
ui.prompt.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    send();
  }
});
document.addEventListener("keydown", (e) => {
  if (e.key === "Escape" && state.controller && !ui.keyDialog.open) {
    e.preventDefault();
    stop();
  }
});
ui.prompt.addEventListener("input", fitPrompt);
ui.stop.addEventListener("click", () => {
  stop();
  ui.prompt.focus();
});
ui.newChat.addEventListener("click", newChat);

connect();
ui.prompt.focus();
