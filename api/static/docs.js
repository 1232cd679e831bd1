// Starts Swagger UI on /docs (a file, not an inline script, so the page's CSP allows no inline code).
"use strict";
window.addEventListener("DOMContentLoaded", function () {
  var root = document.getElementById("swagger-ui");
  window.ui = SwaggerUIBundle({
    url: root.getAttribute("data-url"),
    domNode: root,
    deepLinking: true,
    validatorUrl: null,
    tryItOutEnabled: false,
  });
});
