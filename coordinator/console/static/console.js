// Tether console: live output for a job's page. Every <pre class="output">
// whose data-eof is "false" is extended by polling its data-src endpoint
// from data-offset (bytes), long-polling (wait), until the endpoint says
// Tether-Output-EOF. Text
// is appended as text nodes, never parsed as HTML.
"use strict";
(function () {
  var interval = 1000; // ms between polls after an error or an empty answer
  var wait = 10;        // s the endpoint may hold a poll open for new output
  function follow(pre) {
    var src = pre.getAttribute("data-src");
    var offset = parseInt(pre.getAttribute("data-offset"), 10) || 0;
    var decoder = new TextDecoder("utf-8");
    function poll() {
      fetch(src + "?wait=" + wait + "&offset=" + offset, { credentials: "same-origin", cache: "no-store" })
        .then(function (resp) {
          if (!resp.ok) {
            return resp.text().then(function (t) { throw new Error(resp.status + ": " + t); });
          }
          var eof = resp.headers.get("Tether-Output-EOF") === "true";
          return resp.arrayBuffer().then(function (buf) {
            offset += buf.byteLength;
            pre.setAttribute("data-offset", String(offset));
            var text = decoder.decode(new Uint8Array(buf), { stream: !eof });
            if (text) { pre.appendChild(document.createTextNode(text)); }
            if (eof) {
              pre.setAttribute("data-eof", "true");
              return;
            }
            setTimeout(poll, buf.byteLength > 0 ? 0 : interval);
          });
        })
        .catch(function (err) {
          pre.setAttribute("data-error", String(err.message || err));
          setTimeout(poll, interval * 5);
        });
    }
    poll();
  }
  var outs = document.querySelectorAll("pre.output[data-eof=false]");
  for (var i = 0; i < outs.length; i++) { follow(outs[i]); }
})();
