// shardd console: keeps the session's key and sends it with every
// request (pages, actions, logs), sends the pages' action forms to the
// API, and streams a run's log. No framework, no innerHTML of data: text
// goes in as text.
//
// A session is a cookie, which the browser sends to every port of this
// host (so to other local users' servers too), and a key, which only this
// origin's script has: the login's answer gives it (meta shardd-key), and
// it is kept in this origin's localStorage. A navigation sends only the
// cookie, so it gets a bootstrap page (#boot) with no data: this script
// asks for the same URL with the key and shows that page instead.
"use strict";

(function () {
  const KEY = "shardd-key";
  const KEY_HEADER = "X-Shardd-Key";

  function storedKey() {
    try { return localStorage.getItem(KEY) || ""; } catch (e) { return ""; }
  }
  // The headers of a request made for the session: its key, if any.
  function keyed(headers) {
    const key = storedKey();
    if (key) headers[KEY_HEADER] = key;
    return headers;
  }

  // The answer to a login: keep the key, go on.
  const given = document.querySelector('meta[name="shardd-key"]');
  if (given) {
    const next = document.getElementById("next");
    try {
      localStorage.setItem(KEY, given.content);
    } catch (e) {
      document.getElementById("welcome").textContent = "This browser does not let the console keep its session's key for this address (" + e.message + "): the console cannot work here.";
      return;
    }
    given.remove();
    location.replace(next ? next.getAttribute("href") : "/");
    return;
  }

  const boot = document.getElementById("boot");
  if (boot) load();
  else init();

  // Asks for this page with the key and shows it in place of the
  // bootstrap. Without a key (another browser profile, a logout in
  // another tab) it asks with one that matches nothing, so the answer is
  // the page as anyone sees it, or the login.
  async function load() {
    let resp, body;
    try {
      resp = await fetch(location.href, { headers: { [KEY_HEADER]: storedKey() || "none" }, credentials: "same-origin", cache: "no-store" });
      body = await resp.text();
    } catch (e) {
      boot.textContent = "This instance did not answer (" + e.message + "): reload the page to try again.";
      return;
    }
    if (resp.redirected) {
      location.replace(resp.url);
      return;
    }
    if (!(resp.headers.get("Content-Type") || "").startsWith("text/html")) {
      boot.textContent = resp.status + " " + resp.statusText + ": " + body;
      return;
    }
    const doc = new DOMParser().parseFromString(body, "text/html");
    for (const s of doc.querySelectorAll("script")) s.remove(); // this script is running
    document.title = doc.title;
    document.body.replaceWith(document.adoptNode(doc.body));
    init();
    if (location.hash) {
      const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
      if (target) target.scrollIntoView();
    }
  }

  function init() {
    const flash = document.getElementById("flash");

    // Logout: the form carries the key (without it, the instance only
    // clears this browser's cookie); the key is forgotten here.
    const logout = document.getElementById("logout");
    if (logout) {
      logout.addEventListener("submit", () => {
        logout.elements.key.value = storedKey();
        try { localStorage.removeItem(KEY); } catch (e) { /* nothing kept */ }
      });
    }

    function say(text, ok) {
      if (!flash) return;
      flash.textContent = text;
      flash.className = ok ? "ok" : "bad";
      flash.focus && flash.setAttribute("tabindex", "-1");
    }

    // A message kept across the reload that shows an action's effect.
    const kept = sessionStorage.getItem("shardd-flash");
    if (kept) {
      sessionStorage.removeItem("shardd-flash");
      const m = JSON.parse(kept);
      say(m.text, m.ok);
    }
    function sayAndReload(text) {
      sessionStorage.setItem("shardd-flash", JSON.stringify({ text: text, ok: true }));
      setTimeout(() => location.reload(), 700);
      say(text, true);
    }

    async function post(url, body) {
      const opts = { method: "POST", headers: keyed({}), credentials: "same-origin" };
      if (body !== undefined) {
        opts.headers["Content-Type"] = "application/json";
        opts.body = JSON.stringify(body);
      }
      const resp = await fetch(url, opts);
      let data = {};
      try { data = await resp.json(); } catch (e) { /* not JSON */ }
      if (resp.status === 401) {
        throw new Error("your session has expired, or this instance has restarted: log in again (" + location.origin + "/login)");
      }
      if (!resp.ok) throw new Error(data.error || resp.status + " " + resp.statusText);
      return data;
    }

    // What an action's answer says, in a sentence.
    function describe(data) {
      if (data.message) {
        let text = data.message;
        for (const r of data.results || []) {
          text += "\nitem " + r.item + ": " + (r.state ? r.state + (r.reason ? "/" + r.reason : "") : "still running");
        }
        return text;
      }
      if (data.action && data.job) {
        if (data.action === "unchanged") return "Job " + data.job + ": that version is the registered definition already.";
        return "Job " + data.job + ": " + data.action + (data.version ? ", now version " + data.version : "") + ". The instances that run it take it within seconds.";
      }
      if (data.id && data.runs) {
        let text = "Triggered item(s) " + data.runs.join(", ");
        if (data.rerun) text += " for fire " + data.rerun;
        if (data.param) text += " with parameter " + JSON.stringify(data.param);
        return text + ". Their owners run them now; the history shows them as MANUAL.";
      }
      return "Done.";
    }

    for (const form of document.querySelectorAll("form.act")) {
      form.addEventListener("submit", async (ev) => {
        ev.preventDefault();
        const fields = new FormData(form);
        let question = form.dataset.confirm || "Are you sure?";
        const param = fields.get("param");
        question = question.replace("{fire}", fields.get("fire") || "").replace("{param}", param ? " with parameter " + JSON.stringify(param) : "");
        if (!confirm(question)) return;
        let body;
        if ("json" in form.dataset) {
          body = {};
          for (const [k, v] of fields.entries()) {
            if (v === "") continue;
            body[k] = k === "item" ? Number(v) : v;
          }
        }
        const buttons = form.querySelectorAll("button");
        buttons.forEach((b) => (b.disabled = true));
        try {
          sayAndReload(describe(await post(form.dataset.url, body)));
        } catch (e) {
          say("Refused: " + e.message, false);
        } finally {
          buttons.forEach((b) => (b.disabled = false));
        }
      });
    }

    for (const button of document.querySelectorAll("button.bulk-act")) {
      button.addEventListener("click", async () => {
        const jobs = [...document.querySelectorAll('#bulk input[name="job"]:checked')].map((c) => c.value);
        if (jobs.length === 0) { say("Select jobs first (the boxes in the first column).", false); return; }
        if (!confirm(button.dataset.confirm + "\n\n" + jobs.join(", "))) return;
        const lines = [];
        let failed = 0;
        for (const job of jobs) {
          try {
            const data = await post("/api/v1/jobs/" + encodeURIComponent(job) + "/" + button.dataset.action);
            lines.push(data.message || job + ": done");
          } catch (e) {
            failed++;
            lines.push(job + ": refused: " + e.message);
          }
        }
        if (failed) say(lines.join("\n"), false);
        else sayAndReload(lines.join("\n"));
      });
    }

    const defForm = document.getElementById("def-form");
    if (defForm) editor(defForm);

    // The definition editor: the text is checked by the API's dry run
    // (its problems marked at their lines, or the changes it makes shown),
    // and only a text that passed its check is saved.
    function editor(form) {
      const text = document.getElementById("def-yaml");
      const gutter = document.getElementById("def-gutter");
      const check = document.getElementById("def-check");
      const save = document.getElementById("def-save");
      const problems = document.getElementById("def-problems");
      const diff = document.getElementById("def-diff");
      let checked = null; // the text the last check passed
      const bad = new Set();

      function drawGutter() {
        const n = text.value.split("\n").length;
        gutter.replaceChildren();
        for (let i = 1; i <= n; i++) {
          const span = document.createElement("span");
          span.id = "line-" + i;
          if (bad.has(i)) span.className = "bad-line";
          span.textContent = (bad.has(i) ? "! " : "  ") + i + "\n";
          gutter.appendChild(span);
        }
        gutter.scrollTop = text.scrollTop;
      }
      function selectLine(n) {
        const lines = text.value.split("\n");
        let start = 0;
        for (let i = 0; i < n - 1 && i < lines.length; i++) start += lines[i].length + 1;
        text.focus();
        text.setSelectionRange(start, start + (lines[n - 1] || "").length);
      }
      function jobName() {
        const m = text.value.match(/^\s*-\s*name:\s*["']?([A-Za-z0-9._-]+)/m);
        return m ? m[1] : form.dataset.job;
      }
      async function put(dry) {
        const job = jobName();
        if (!job) throw new Error("the text names no job (- name: ...)");
        const q = [];
        if (dry) q.push("dryRun=1");
        if ("takeOver" in form.dataset) q.push("takeOver=1");
        const resp = await fetch("/api/v1/definitions/" + encodeURIComponent(job) + (q.length ? "?" + q.join("&") : ""), {
          method: "PUT", headers: keyed({ "Content-Type": "application/yaml" }), credentials: "same-origin", body: text.value,
        });
        let data = {};
        try { data = await resp.json(); } catch (e) { /* not JSON */ }
        if (resp.status === 401) throw new Error("your session has expired, or this instance has restarted: log in again (" + location.origin + "/login)");
        return { ok: resp.ok, status: resp.status, data: data, job: job };
      }
      function cell(tr, value) {
        const td = document.createElement("td");
        td.textContent = value === "" ? "-" : value;
        tr.appendChild(td);
      }

      text.addEventListener("input", () => {
        checked = null;
        save.disabled = true;
        drawGutter();
      });
      text.addEventListener("scroll", () => { gutter.scrollTop = text.scrollTop; });
      drawGutter();

      check.addEventListener("click", async () => {
        problems.replaceChildren();
        diff.hidden = true;
        bad.clear();
        let r;
        try {
          r = await put(true);
        } catch (e) {
          say("Not checked: " + e.message, false);
          return;
        }
        if (r.status === 422) {
          for (const p of r.data.problems || []) {
            const li = document.createElement("li");
            if (p.line) {
              bad.add(p.line);
              const b = document.createElement("button");
              b.type = "button";
              b.className = "line";
              b.textContent = "line " + p.line;
              b.addEventListener("click", () => selectLine(p.line));
              li.appendChild(b);
              li.appendChild(document.createTextNode(" "));
            }
            // The line is the button's: the message without its "definition:4: ".
            li.appendChild(document.createTextNode(p.line ? p.message.replace(/^definition:\d+: /, "") : p.message));
            problems.appendChild(li);
          }
          drawGutter();
          say("The definition has " + (r.data.problems || []).length + " problem(s); nothing saved.", false);
          return;
        }
        drawGutter();
        if (!r.ok) {
          say("Refused: " + (r.data.error || r.status), false);
          return;
        }
        const tbody = diff.querySelector("tbody");
        tbody.replaceChildren();
        for (const c of r.data.diff || []) {
          const tr = document.createElement("tr");
          cell(tr, c.field);
          cell(tr, c.old);
          cell(tr, c.new);
          tbody.appendChild(tr);
        }
        if (r.data.action === "unchanged") {
          say("No change: this is the registered definition.", true);
          return;
        }
        diff.hidden = false;
        checked = text.value;
        save.disabled = false;
        say("Valid. Job " + r.job + " would be " + (r.data.action === "create" ? "created" : r.data.action === "take-over" ? "taken over from the hosts' files" : "updated") + ": the changes are below; Save applies them.", true);
      });

      save.addEventListener("click", async () => {
        if (text.value !== checked) {
          say("Check the text first: it changed since its last check.", false);
          return;
        }
        const job = jobName();
        if (!confirm("Save job " + job + "? The instances that run it take the new definition within seconds.")) return;
        save.disabled = true;
        try {
          const r = await put(false);
          if (!r.ok) {
            say("Refused: " + (r.data.error || r.status), false);
            return;
          }
          sessionStorage.setItem("shardd-flash", JSON.stringify({ text: "Job " + job + " saved as version " + r.data.version + ".", ok: true }));
          location.assign("/jobs/" + encodeURIComponent(job) + "/definition");
        } catch (e) {
          say("Not saved: " + e.message, false);
        } finally {
          save.disabled = checked === null;
        }
      });
    }

    // The run log: records "<time> <tag> <text>", streamed while the run lives.
    const pre = document.getElementById("log-text");
    if (pre) {
      const state = document.getElementById("log-state");
      const follow = document.getElementById("log-follow");
      let ctl;
      function line(rec) {
        const sp = rec.indexOf(" "), sp2 = rec.indexOf(" ", sp + 1);
        if (sp < 0 || sp2 < 0) return;
        const time = rec.slice(11, 19), tag = rec.slice(sp + 1, sp2), text = rec.slice(sp2 + 1);
        const span = document.createElement("span");
        span.className = tag.replace("+", "");
        span.textContent = time + " " + (tag === "shardd" ? "[shardd] " : tag.startsWith("err") ? "[err] " : "") + text + (tag.endsWith("+") ? "" : "\n");
        pre.appendChild(span);
      }
      async function loadLog() {
        if (ctl) ctl.abort();
        ctl = new AbortController();
        pre.textContent = "";
        state.textContent = follow.checked ? "following…" : "loading…";
        try {
          const resp = await fetch(pre.dataset.src + (follow.checked ? "?follow=1" : ""), { headers: keyed({}), credentials: "same-origin", signal: ctl.signal });
          if (!resp.ok) {
            let msg = resp.status + " " + resp.statusText;
            try { msg = (await resp.json()).error || msg; } catch (e) { /* not JSON */ }
            state.textContent = "No log: " + msg;
            return;
          }
          const reader = resp.body.getReader();
          const dec = new TextDecoder();
          let buf = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            buf += dec.decode(value, { stream: true });
            let i;
            while ((i = buf.indexOf("\n")) >= 0) {
              line(buf.slice(0, i));
              buf = buf.slice(i + 1);
            }
            pre.scrollTop = pre.scrollHeight;
          }
          state.textContent = "End of the log" + (follow.checked ? ": the run has ended." : ".");
        } catch (e) {
          if (e.name !== "AbortError") state.textContent = "The log stream broke: " + e.message;
        }
      }
      follow.addEventListener("change", loadLog);
      loadLog();
    }
  }
})();
