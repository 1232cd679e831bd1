/*! tally.js: the browser script of tally (CONTRACT section 4, "Browser script"). Plain ES2017.
 *
 *   <script src="https://tally.example/sdk/v1/tally.js" data-program-id="prog_..." defer></script>
 *   or: tally.init({ programId: "prog_...", apiBase: "https://tally.example" })
 *
 * On a page whose URL has ?aff=<partner_code> it records a click and keeps the click id in the
 * first-party cookie `svc_click_id` (path /, 90 days, SameSite=Lax, Secure on https).
 * `tally.signup(userId)` (alias `tally.trackLead({ customerExternalId })`) reports a browser-mode
 * lead carrying that click id; it waits for a click still in flight (`tally.ready`).
 * It never sends a program API key: sales are tracked from the brand's server only.
 */
(function () {
  "use strict";

  var COOKIE = "svc_click_id";
  var COOKIE_MAX_AGE = 90 * 24 * 60 * 60;
  var MAX_TEXT = 2048;
  var SCRIPT_PATH = "/sdk/v1/tally.js";

  var currentScript = document.currentScript || document.querySelector('script[src*="' + SCRIPT_PATH + '"]');
  var config = null;
  var resolveReady = null;
  var ready = new Promise(function (resolve) {
    resolveReady = resolve;
  });

  function readCookie(name) {
    var parts = document.cookie ? document.cookie.split(";") : [];
    for (var i = 0; i < parts.length; i++) {
      var part = parts[i].trim();
      if (part.indexOf(name + "=") === 0) {
        try {
          return decodeURIComponent(part.slice(name.length + 1)) || null;
        } catch (e) {
          return null;
        }
      }
    }
    return null;
  }

  function writeCookie(name, value) {
    var attrs = "; path=/; max-age=" + COOKIE_MAX_AGE + "; SameSite=Lax";
    if (window.location.protocol === "https:") attrs += "; Secure";
    document.cookie = name + "=" + encodeURIComponent(value) + attrs;
  }

  function defaultApiBase() {
    if (currentScript && currentScript.src) {
      try {
        return new URL(currentScript.src, window.location.href).origin;
      } catch (e) {
        /* fall through to the page's origin */
      }
    }
    return window.location.origin;
  }

  async function post(path, body) {
    var response = await fetch(config.apiBase + path, {
      method: "POST",
      mode: "cors",
      credentials: "omit",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    });
    var payload = null;
    try {
      payload = await response.json();
    } catch (e) {
      payload = null;
    }
    if (!response.ok) {
      var error = (payload && payload.error) || {};
      var failure = new Error("tally: " + (error.message || "HTTP " + response.status));
      failure.code = error.code || "http_" + response.status;
      failure.status = response.status;
      throw failure;
    }
    return payload && payload.data;
  }

  async function recordClick(partnerCode) {
    var body = { program_id: config.programId, partner_code: partnerCode, url: window.location.href.slice(0, MAX_TEXT) };
    if (document.referrer) body.referrer = document.referrer.slice(0, MAX_TEXT);
    try {
      var data = await post("/api/v1/track/click", body);
      writeCookie(COOKIE, data.click_id);
      return data.click_id;
    } catch (e) {
      if (window.console) window.console.warn("tally: click not recorded:", e.message);
      return readCookie(COOKIE);
    }
  }

  function init(options) {
    if (config) return ready;
    options = options || {};
    var programId = options.programId || options.program_id;
    if (!programId) throw new TypeError("tally.init needs { programId }");
    var apiBase = String(options.apiBase || options.api_base || defaultApiBase()).replace(/\/+$/, "");
    config = { programId: String(programId), apiBase: apiBase };
    var partnerCode = null;
    try {
      partnerCode = new URLSearchParams(window.location.search).get("aff");
    } catch (e) {
      partnerCode = null;
    }
    if (partnerCode) {
      recordClick(partnerCode).then(resolveReady);
    } else {
      resolveReady(readCookie(COOKIE));
    }
    return ready;
  }

  async function signup(userId, extra) {
    if (!config) throw new Error("tally: call tally.init({ programId }) first (or set data-program-id)");
    if (typeof userId !== "string" || !userId) throw new TypeError("tally.signup needs the user's id (a string)");
    await ready;
    var body = { customer_external_id: userId, program_id: config.programId };
    var clickId = readCookie(COOKIE);
    if (clickId) body.click_id = clickId;
    if (extra && extra.email) body.email = extra.email;
    if (extra && extra.name) body.name = extra.name;
    return post("/api/v1/track/lead", body);
  }

  function trackLead(lead) {
    lead = lead || {};
    return signup(lead.customerExternalId || lead.customer_external_id, lead);
  }

  window.tally = {
    init: init,
    signup: signup,
    trackLead: trackLead,
    ready: ready,
    clickId: function () {
      return readCookie(COOKIE);
    },
  };

  var programId = currentScript && currentScript.getAttribute("data-program-id");
  if (programId) {
    try {
      init({ programId: programId, apiBase: currentScript.getAttribute("data-api-base") || undefined });
    } catch (e) {
      if (window.console) window.console.warn("tally:", e.message);
    }
  }
})();
