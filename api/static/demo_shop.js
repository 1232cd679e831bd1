/*! The demo brand page's own script: it only shows what tally.js did (the click it recorded for
 * ?aff=, and the lead the sign-up form reports with tally.signup). */
(function () {
  "use strict";

  var clickStatus = document.getElementById("click-status");
  var leadStatus = document.getElementById("lead-status");
  var aff = new URLSearchParams(window.location.search).get("aff");

  function show(element, state, text) {
    element.setAttribute("data-state", state);
    element.textContent = text;
  }

  if (!window.tally) {
    show(clickStatus, "failed", "The browser script did not load.");
    return;
  }
  window.tally.ready.then(function (clickId) {
    if (aff && clickId) {
      show(clickStatus, "recorded", "Click recorded for partner " + aff + ": " + clickId +
        " (kept in the svc_click_id cookie of this site).");
    } else if (aff) {
      show(clickStatus, "failed", "The click for partner " + aff +
        " was not recorded: is the code a partner of this program? (the browser console says why)");
    } else if (clickId) {
      show(clickStatus, "kept", "No ?aff= this time; the earlier click " + clickId + " is still in the cookie.");
    } else {
      show(clickStatus, "none", "No ?aff= in this page's address and no earlier click: nothing to record.");
    }
  });

  document.getElementById("signup-form").addEventListener("submit", function (event) {
    event.preventDefault();
    var userId = document.getElementById("user-id").value.trim();
    show(leadStatus, "sending", "Reporting the sign-up…");
    window.tally.signup(userId).then(
      function (lead) {
        show(leadStatus, "recorded", "Lead " + lead.lead_id + " recorded for " + lead.customer_external_id +
          " (" + lead.status + ")" + (window.tally.clickId() ? ", with the click." : ", without a click."));
      },
      function (error) {
        show(leadStatus, "failed", "The sign-up was refused: " + (error.code || error.message));
      }
    );
  });
})();
