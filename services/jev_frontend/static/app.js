// The jev page: a playground for POST /v1/systemone and a live view of GET /v1/status.
// Plain script, no build step, nothing from outside this origin (the page's CSP allows nothing else).
"use strict";

(() => {
  const STATUS_REFRESH_MS = 3000;
  const MODELS_RETRY_MS = 3000;
  const IMAGE_REF = "<image:1>";
  // per question type: its label, and the rows of its criteria (null: none)
  const TYPES = {
    noul: { label: "yes/no", rows: null },
    choice: { label: "choice", rows: { noun: "option", min: 2, described: true, criteria: "object" } },
    score: { label: "score", rows: { noun: "level", min: 2, described: false, criteria: "list" } },
    span: { label: "span", rows: { noun: "candidate", min: 2, described: false, criteria: "list" } },
    set: { label: "set", rows: { noun: "statement", min: 1, described: true, criteria: "object" } },
  };
  const EXAMPLE = {
    state: "It is raining and I am going out.",
    type: "choice",
    instructions: "What should I take?",
    options: ["umbrella", "sunglasses"],
  };

  const $ = (id) => document.getElementById(id);
  const el = (tag, className, text) => {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  };

  // ----- the API key: asked for when the stack wants one, kept in this variable only -----------
  let apiKey = null;
  let keyWaiters = [];

  function askForKey(message) {
    $("key-panel").hidden = false;
    $("key-message").textContent = message;
    $("key-input").focus();
    return new Promise((resolve) => keyWaiters.push(resolve));
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const given = $("key-input").value.trim();
    if (!given) return;
    apiKey = given;
    $("key-input").value = "";
    $("key-panel").hidden = true;
    const waiters = keyWaiters;
    keyWaiters = [];
    waiters.forEach((resolve) => resolve());
  });

  function errorType(body) {
    const detail = body && body.detail;
    if (Array.isArray(detail)) return "validation_error";
    return detail && typeof detail === "object" ? detail.error_type : undefined;
  }

  // One call to this origin: {status, body (parsed JSON, or the text), ok}. An authentication error asks for a
  // key and tries again with it.
  async function api(method, path, payload) {
    for (;;) {
      const headers = { Accept: "application/json" };
      if (payload !== undefined) headers["Content-Type"] = "application/json";
      if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
      const response = await fetch(path, {
        method,
        headers,
        body: payload === undefined ? undefined : JSON.stringify(payload),
        cache: "no-store",
        credentials: "omit",
      });
      const text = await response.text();
      let body = text;
      try {
        body = JSON.parse(text);
      } catch (_) {
        // not JSON: kept as text
      }
      if ((response.status === 401 || response.status === 403) && errorType(body) === "authentication_error") {
        await askForKey(apiKey ? "That key was not accepted: try another." : "This stack needs an API key.");
        continue;
      }
      return { status: response.status, ok: response.ok, body };
    }
  }

  // The API's own error message(s), whatever the error's shape.
  function errorText(status, body) {
    const detail = body && body.detail;
    if (Array.isArray(detail)) {
      const items = detail.map((item) => {
        const where = (item.loc || []).filter((part) => part !== "body").join(".");
        return where ? `${where}: ${item.msg}` : item.msg;
      });
      return `${status} validation_error: ${items.join("; ")}`;
    }
    if (detail && typeof detail === "object" && detail.message) {
      return `${status} ${detail.error_type || "error"}: ${detail.message}`;
    }
    return `${status}: ${typeof body === "string" ? body.slice(0, 500) : JSON.stringify(body)}`;
  }

  // ----- tabs --------------------------------------------------------------------------------------
  function showTab(name) {
    const play = name === "play";
    $("play").hidden = !play;
    $("status").hidden = play;
    $("tab-play").setAttribute("aria-selected", String(play));
    $("tab-status").setAttribute("aria-selected", String(!play));
    if (!play) refreshStatus();
  }
  $("tab-play").addEventListener("click", () => showTab("play"));
  $("tab-status").addEventListener("click", () => showTab("status"));

  // ----- models ------------------------------------------------------------------------------------
  let models = [];

  async function loadModels() {
    let answer;
    try {
      answer = await api("GET", "/v1/models");
    } catch (error) {
      $("model-note").textContent = `could not reach the frontend: ${error.message}`;
      return;
    }
    if (!answer.ok) {
      $("model-note").textContent = errorText(answer.status, answer.body);
      if (answer.status === 503) setTimeout(loadModels, MODELS_RETRY_MS); // no backend in rotation yet
      return;
    }
    models = answer.body.models || [];
    const select = $("model");
    select.replaceChildren();
    for (const info of models) {
      const option = el("option", "", info.name);
      option.value = info.name;
      option.title = info.description || "";
      select.append(option);
    }
    const named = models.find((info) => info.name !== "jev-latest");
    if (named) select.value = named.name;
    modelChanged();
  }

  function selectedModel() {
    return models.find((info) => info.name === $("model").value);
  }

  function modelChanged() {
    const info = selectedModel();
    const vision = Boolean(info && info.x_modality === "vision-language");
    $("image-row").hidden = !vision;
    $("model-note").textContent = info ? info.description || "" : "";
  }
  $("model").addEventListener("change", modelChanged);

  // ----- question editors --------------------------------------------------------------------------
  let questionCount = 0;

  function addOption(question, spec, name, description) {
    const row = $("tpl-option").content.firstElementChild.cloneNode(true);
    const rows = question.querySelector(".option-rows");
    row.querySelector(".name").placeholder = spec.described ? `${spec.noun} name` : `${spec.noun} ${rows.children.length}`;
    row.querySelector(".name").value = name || "";
    const describe = row.querySelector(".description");
    if (spec.described) describe.value = description || "";
    else describe.remove();
    row.querySelector(".remove-option").addEventListener("click", () => row.remove());
    rows.append(row);
  }

  function addQuestion(type, instructions, options) {
    const spec = TYPES[type];
    const question = $("tpl-question").content.firstElementChild.cloneNode(true);
    questionCount += 1;
    question.dataset.type = type;
    question.querySelector(".qtype").textContent = spec.label;
    question.querySelector(".qid").value = `q${questionCount}`;
    question.querySelector(".instructions").value = instructions || "";
    question.querySelector(".remove").addEventListener("click", () => question.remove());
    if (type !== "noul") question.querySelector(".noul-criteria").remove();
    if (spec.rows) {
      const add = question.querySelector(".add-option");
      add.textContent = `+ ${spec.rows.noun}`;
      add.addEventListener("click", () => addOption(question, spec.rows));
      const given = options || [];
      for (let i = 0; i < Math.max(spec.rows.min, given.length); i += 1) addOption(question, spec.rows, given[i]);
    } else {
      question.querySelector(".options").remove();
    }
    $("questions").append(question);
    return question;
  }

  document.querySelectorAll("[data-add]").forEach((button) => {
    button.addEventListener("click", () => addQuestion(button.dataset.add).querySelector(".instructions").focus());
  });

  // ----- the request -------------------------------------------------------------------------------
  class InputError extends Error {}

  function questionJson(question) {
    const type = question.dataset.type;
    const spec = TYPES[type].rows;
    const out = { type };
    const instructions = question.querySelector(".instructions").value.trim();
    if (instructions) out.instructions = instructions;
    if (type === "noul") {
      const criteria = {};
      const yes = question.querySelector(".criterion-true").value.trim();
      const no = question.querySelector(".criterion-false").value.trim();
      if (yes) criteria.true = yes;
      if (no) criteria.false = no;
      if (yes || no) out.criteria = criteria;
      return out;
    }
    const rows = [...question.querySelectorAll(".option")].map((row) => ({
      name: row.querySelector(".name").value,
      description: spec.described ? row.querySelector(".description").value.trim() : "",
    }));
    if (spec.criteria === "list") {
      out.criteria = rows.map((row) => row.name);
    } else {
      out.criteria = {};
      for (const row of rows) {
        if (row.name in out.criteria) throw new InputError(`${question.querySelector(".qid").value}: ${spec.noun} "${row.name}" is listed twice`);
        out.criteria[row.name] = row.description || null;
      }
    }
    return out;
  }

  function stateJson() {
    const text = $("state").value;
    if (document.querySelector("input[name=state-kind]:checked").value === "text") return text;
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new InputError(`the state is not valid JSON: ${error.message}`);
    }
  }

  function readImage(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
      reader.onerror = () => reject(new InputError(`could not read ${file.name}`));
      reader.readAsDataURL(file);
    });
  }

  async function buildRequest() {
    const request = { model: $("model").value, state: stateJson(), questions: {} };
    const questions = [...document.querySelectorAll("#questions .question")];
    if (!questions.length) throw new InputError("add a question first");
    for (const question of questions) {
      const id = question.querySelector(".qid").value;
      if (id in request.questions) throw new InputError(`two questions have the id "${id}"`);
      request.questions[id] = questionJson(question);
    }
    const file = !$("image-row").hidden && $("image").files[0];
    if (file) {
      if (typeof request.state === "string") {
        if (!request.state.includes(IMAGE_REF)) request.state = `${IMAGE_REF}\n${request.state}`;
      } else if (!JSON.stringify(request.state).includes(IMAGE_REF)) {
        throw new InputError(`put "${IMAGE_REF}" in a string of the JSON state where the image goes`);
      }
      const format = file.type === "image/png" ? "png" : "jpeg";
      request.assets = { [IMAGE_REF]: { type: "image", format, data_base64: await readImage(file) } };
    }
    return request;
  }

  function shownRequest(request) {
    // the raw view shows the image's base64 shortened; what was sent is the whole of it
    if (!request.assets) return request;
    const assets = {};
    for (const [ref, asset] of Object.entries(request.assets)) {
      assets[ref] = { ...asset, data_base64: `${asset.data_base64.slice(0, 32)}… (${asset.data_base64.length} characters)` };
    }
    return { ...request, assets };
  }

  // ----- the answer --------------------------------------------------------------------------------
  const fixed = (value) => (typeof value === "number" ? value.toFixed(3) : String(value));
  const contentText = (value) => (typeof value === "string" ? value : JSON.stringify(value));

  function barRow(label, p, chosen) {
    const row = el("div", chosen ? "bar-row chosen" : "bar-row");
    row.dataset.option = label;
    row.append(el("span", "label", label));
    const bar = el("span", "bar");
    const fill = el("span", "fill");
    fill.style.width = `${Math.max(0, Math.min(1, p)) * 100}%`;
    bar.append(fill);
    row.append(bar, el("span", "p", fixed(p)));
    return row;
  }

  function answerCard(id, answer) {
    const card = el("article", "answer");
    card.dataset.question = id;
    const head = el("h3");
    head.append(el("span", "qid", id), el("span", "qtype", answer.type));
    card.append(head);
    const summary = el("p", "summary");
    const bars = el("div", "bars");
    const probabilities = answer.probabilities || {};
    if (answer.type === "noul") {
      summary.textContent = `P(yes) ${fixed(answer.noul)}`;
      bars.append(barRow("yes", answer.noul, answer.noul >= 0.5));
    } else if (answer.type === "score") {
      summary.textContent = `score ${fixed(answer.score)}`;
      for (const [level, p] of Object.entries(probabilities)) {
        const legend = answer.legend && level in answer.legend ? contentText(answer.legend[level]) : level;
        const row = barRow(`${level} · ${legend}`, p, false);
        row.dataset.option = level;
        bars.append(row);
      }
    } else if (answer.type === "set") {
      const selected = answer.selected || [];
      summary.textContent = `selected: ${selected.length ? selected.join(", ") : "none"}`;
      for (const [name, p] of Object.entries(probabilities)) bars.append(barRow(name, p, selected.includes(name)));
    } else {
      const chosen = answer.type === "span" ? answer.span && answer.span.text : answer.choice;
      summary.textContent = answer.type === "span" ? `span: ${chosen}` : `choice: ${chosen}`;
      for (const [name, p] of Object.entries(probabilities)) bars.append(barRow(name, p, name === chosen));
    }
    if (typeof answer.confidence === "number") {
      summary.append(el("span", "confidence", ` · confidence ${fixed(answer.confidence)}`));
    }
    card.append(summary, bars);
    return card;
  }

  function showAnswer(body) {
    const answers = $("answers");
    for (const [id, answer] of Object.entries(body.answers || {})) answers.append(answerCard(id, answer));
    const usage = body.usage || {};
    const parts = [`model ${body.model}`, `${usage.input_tokens} input tokens`];
    if (typeof body.x_cached_input_tokens === "number") parts.push(`${body.x_cached_input_tokens} cached`);
    if (typeof body.x_elapsed_seconds === "number") parts.push(`${body.x_elapsed_seconds.toFixed(3)} s`);
    $("usage").textContent = parts.join(" · ");
  }

  function showError(message) {
    $("error").textContent = message;
    $("error").hidden = false;
  }

  $("ask-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    $("result").hidden = false;
    $("error").hidden = true;
    $("answers").replaceChildren();
    $("usage").textContent = "";
    $("raw-request").textContent = "";
    $("raw-response").textContent = "";
    $("ask").disabled = true;
    $("busy").hidden = false;
    try {
      const request = await buildRequest();
      $("raw-request").textContent = JSON.stringify(shownRequest(request), null, 2);
      const answer = await api("POST", "/v1/systemone", request);
      $("raw-response").textContent = typeof answer.body === "string" ? answer.body : JSON.stringify(answer.body, null, 2);
      if (answer.ok) showAnswer(answer.body);
      else showError(errorText(answer.status, answer.body));
    } catch (error) {
      showError(error instanceof InputError ? error.message : `could not ask: ${error.message}`);
    } finally {
      $("ask").disabled = false;
      $("busy").hidden = true;
    }
  });

  // ----- status ------------------------------------------------------------------------------------
  const dash = "—";
  const seconds = (value) => {
    if (typeof value !== "number") return dash;
    return value < 1 ? `${(value * 1000).toFixed(value < 0.01 ? 1 : 0)} ms` : `${value.toFixed(2)} s`;
  };
  const percent = (value) => (typeof value === "number" ? `${(value * 100).toFixed(1)} %` : dash);

  function statusRow(backend) {
    const row = el("tr");
    row.dataset.url = backend.url;
    const cell = (text, column, className) => {
      const td = el("td", className || "", text);
      td.dataset.column = column;
      row.append(td);
      return td;
    };
    const where = cell(backend.url, "url", "url");
    if (backend.worker_id) where.title = `worker ${backend.worker_id} (${backend.source})`;
    cell(backend.model || "?", "model");
    const health = cell(backend.state, "health", `health ${backend.state}`);
    if (backend.error) health.title = backend.error;
    cell(String(backend.queue_depth), "queue", "num");
    cell(String(backend.in_flight), "in_flight", "num");
    cell(typeof backend.decisions_per_s === "number" ? backend.decisions_per_s.toFixed(2) : dash, "rate", "num");
    const l3 = backend.l3;
    const ratio = l3 ? (l3.recent_hit_ratio ?? l3.hit_ratio) : null;
    const hits = cell(percent(ratio), "l3", "num");
    if (l3) {
      const recent = l3.recent_hit_ratio === null ? "" : `${percent(l3.recent_hit_ratio)} in the window; `;
      hits.title = `${recent}${l3.hits} hits, ${l3.misses} misses since the worker started`;
    } else {
      hits.title = "the worker reports no L3 counters";
    }
    cell(seconds(backend.p50_s), "p50", "num");
    cell(seconds(backend.p99_s), "p99", "num");
    return row;
  }

  let statusTimer = null;
  let statusRun = 0; // only the latest refresh schedules the next one

  async function refreshStatus() {
    clearTimeout(statusTimer);
    const run = ++statusRun;
    if ($("status").hidden || document.hidden) return;
    try {
      const answer = await api("GET", "/v1/status");
      if (run !== statusRun) return;
      if (answer.ok) {
        const body = answer.body;
        $("status-error").hidden = true;
        $("status-table").querySelector("tbody").replaceChildren(...body.backends.map(statusRow));
        const span = body.window_s > 0 ? `rates over the last ${Math.round(body.window_s)} s` : "rates from the next refresh on";
        $("status-summary").textContent =
          `${body.backends.length} backend(s) · routing ${body.routing} · default model ${body.default_model || dash} · ` +
          `${span} · updated ${new Date().toLocaleTimeString()}`;
      } else {
        $("status-error").textContent = errorText(answer.status, answer.body);
        $("status-error").hidden = false;
      }
    } catch (error) {
      $("status-error").textContent = `could not reach the frontend: ${error.message}`;
      $("status-error").hidden = false;
    }
    if (run === statusRun && !$("status").hidden) statusTimer = setTimeout(refreshStatus, STATUS_REFRESH_MS);
  }

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refreshStatus();
  });

  // ----- start -------------------------------------------------------------------------------------
  $("state").value = EXAMPLE.state;
  addQuestion(EXAMPLE.type, EXAMPLE.instructions, EXAMPLE.options);
  loadModels();
})();
