/* Search from disk (file://), with no network.

   Material's search runs in a Web Worker, and browsers refuse `new Worker(url)` from a file://
   page. Material's offline plugin answers with a shim fetched from a CDN (unpkg.com's
   iframe-worker), which fails offline: the search box stays at "Initializing search". This file
   is our own shim in its place (mkdocs.yml lists it under extra.polyfills; the file name keeps
   the offline plugin from adding the CDN's): on a file:// page, `Worker` runs the worker's
   script in a hidden same-origin iframe of the page, and messages go both ways as events, so
   the search runs in the page. The index itself comes from search/search_index.js, which
   Material's page script loads on file:// and posts to the worker. Served over http(s), the
   browser's own Worker is used. */
(function () {
  "use strict";
  if (location.protocol !== "file:") return;

  function IframeWorker(url) {
    var target = document.createElement("div"); // an EventTarget for the page's listeners
    var frame = document.createElement("iframe");
    var queue = [];
    var scope = null;
    var self = this;
    frame.hidden = true;
    frame.setAttribute("aria-hidden", "true");
    document.body.appendChild(frame);
    scope = frame.contentWindow;
    // the worker's global postMessage sends to the page
    scope.postMessage = function (data) {
      setTimeout(function () {
        var event = new MessageEvent("message", { data: data });
        target.dispatchEvent(event);
        if (typeof self.onmessage === "function") self.onmessage(event);
      }, 0);
    };
    scope.importScripts = function () {
      throw new Error("importScripts is not available to a worker run from disk");
    };
    var script = scope.document.createElement("script");
    script.src = new URL(url, location.href).href;
    script.onload = function () {
      var pending = queue;
      queue = null;
      pending.forEach(function (data) { self.postMessage(data); });
    };
    script.onerror = function () {
      var event = new Event("error");
      target.dispatchEvent(event);
      if (typeof self.onerror === "function") self.onerror(event);
    };
    scope.document.head.appendChild(script);

    this.onmessage = null;
    this.onerror = null;
    this.addEventListener = target.addEventListener.bind(target);
    this.removeEventListener = target.removeEventListener.bind(target);
    this.dispatchEvent = target.dispatchEvent.bind(target);
    this.postMessage = function (data) {
      if (queue !== null) {
        queue.push(data);
        return;
      }
      setTimeout(function () {
        scope.dispatchEvent(new scope.MessageEvent("message", { data: data }));
      }, 0);
    };
    this.terminate = function () {
      frame.remove();
    };
  }

  window.Worker = IframeWorker;
})();
