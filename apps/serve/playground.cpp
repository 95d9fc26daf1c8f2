#include "apps/serve/playground.h"

namespace tmx::serve {

const char* const kPlaygroundHtml = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tmx playground</title>
<style>
  body { font: 15px/1.5 system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
  h1 { font-size: 1.3rem; }
  textarea { width: 100%; height: 6rem; font: inherit; box-sizing: border-box; }
  .row { display: flex; gap: 1rem; align-items: center; flex-wrap: wrap; margin: .6rem 0; }
  label { display: flex; gap: .4rem; align-items: center; }
  input[type=number] { width: 5.5rem; }
  #out { white-space: pre-wrap; border: 1px solid #ccc; border-radius: 4px; padding: .8rem; min-height: 6rem; }
  #out .prompt { color: #777; }
  #status { color: #555; font-size: .9rem; }
</style>
</head>
<body>
<h1>tmx playground</h1>
<textarea id="prompt" placeholder="Once upon a time">Once upon a time</textarea>
<div class="row">
  <label>temperature <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.8"></label>
  <label>max tokens <input id="max_tokens" type="number" min="1" max="4096" step="1" value="128"></label>
  <label>API key <input id="key" type="password" placeholder="(if the server needs one)"></label>
  <button id="go">Generate</button>
  <button id="stop" disabled>Stop</button>
</div>
<div id="out"></div>
<p id="status">ready</p>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let controller = null;

async function generate() {
  const out = $("out"), status = $("status");
  out.textContent = "";
  const p = document.createElement("span");
  p.className = "prompt";
  p.textContent = $("prompt").value;
  const gen = document.createElement("span");
  gen.id = "generated";
  out.append(p, gen);
  controller = new AbortController();
  $("go").disabled = true;
  $("stop").disabled = false;
  const headers = { "Content-Type": "application/json" };
  if ($("key").value) headers.Authorization = "Bearer " + $("key").value;
  const body = {
    prompt: $("prompt").value,
    temperature: Number($("temperature").value),
    max_tokens: Number($("max_tokens").value),
    stream: true,
    logprobs: 0,  // each chunk then lists its tokens: the count behind tokens/s
  };
  const t0 = performance.now();
  let first = 0, tokens = 0;
  status.textContent = "waiting for the first token...";
  try {
    const res = await fetch("/v1/completions", { method: "POST", headers, body: JSON.stringify(body),
                                                 signal: controller.signal });
    if (!res.ok) {
      const err = await res.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || res.statusText);
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "", finish = null;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let at;
      while ((at = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, at);
        buffer = buffer.slice(at + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        const choice = chunk.choices[0];
        if (choice.logprobs) tokens += choice.logprobs.tokens.length;
        if (choice.text) {
          if (!first) first = performance.now();
          gen.textContent += choice.text;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
        const seconds = (performance.now() - (first || t0)) / 1000;
        status.textContent = `${tokens} tokens, ${seconds > 0 ? (tokens / seconds).toFixed(1) : "-"} tokens/s`;
      }
    }
    const total = (performance.now() - t0) / 1000;
    status.textContent = `done (${finish}): first text after ${((first - t0) / 1000).toFixed(2)} s, ` +
                         `${tokens} tokens in ${total.toFixed(2)} s, ${(tokens / Math.max(total, 1e-6)).toFixed(1)} tokens/s`;
  } catch (e) {
    status.textContent = e.name === "AbortError" ? "stopped" : "error: " + e.message;
  } finally {
    $("go").disabled = false;
    $("stop").disabled = true;
    controller = null;
  }
}

$("go").addEventListener("click", generate);
$("stop").addEventListener("click", () => controller && controller.abort());
</script>
</body>
</html>
)HTML";

}  // namespace tmx::serve
