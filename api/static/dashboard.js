/*! tally dashboard: copy buttons. Without this script the snippets stay plain, selectable text
 * and the buttons stay hidden; with it, each `button[data-copy]` copies the text of the element
 * its attribute names, and says whether that worked. */
(function () {
  "use strict";

  function copyWithSelection(text) {
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "copy-buffer";
    document.body.appendChild(area);
    area.select();
    try {
      return document.execCommand("copy");
    } catch (e) {
      return false;
    } finally {
      document.body.removeChild(area);
    }
  }

  function copy(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text).then(
        function () {
          return true;
        },
        function () {
          return copyWithSelection(text);
        }
      );
    }
    return Promise.resolve(copyWithSelection(text));
  }

  function say(button, copied) {
    button.textContent = copied ? "Copied" : "Select it and copy";
    button.setAttribute("data-copied", copied ? "yes" : "no");
    window.setTimeout(function () {
      button.textContent = "Copy";
    }, 2000);
  }

  var buttons = document.querySelectorAll("button[data-copy]");
  Array.prototype.forEach.call(buttons, function (button) {
    var source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      copy(source.textContent).then(function (copied) {
        say(button, copied);
      });
    });
  });
})();
