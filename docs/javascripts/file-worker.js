/* Search in a site opened as files (build/site/index.html): Material computes search results in a Web Worker,
   and a browser does not start a worker from a file:// page. On such a page this replaces Worker with one that
   runs the worker's script in a hidden frame and talks to it over a MessageChannel; served over http(s), the
   browser's own Worker is used. */
(function () {
  if (location.protocol !== "file:") return;

  // Runs in the frame before the worker's script: its global addEventListener("message") and postMessage,
  // which a worker's script calls, go through the channel's port instead of the frame's window.
  // The page hands the frame its end of the channel with postMessage("vitlab-port", "*", [port]): a frame of the
  // page's origin gets that call on the replaced postMessage, another one as a message event.
  var FRAME = [
    "var handlers = [], port, add = window.addEventListener.bind(window);",
    "function connect(p) {",
    "  port = p;",
    "  port.onmessage = function (m) { handlers.forEach(function (h) { h({data: m.data}); }); };",
    "}",
    "add('message', function (event) { if (event.data === 'vitlab-port' && event.ports[0]) connect(event.ports[0]); });",
    "window.addEventListener = function (type, h) { type === 'message' ? handlers.push(h) : add(type, h); };",
    "window.postMessage = function (data, origin, transfer) {",
    "  if (data === 'vitlab-port' && transfer) connect(transfer[0]); else port.postMessage(data);",
    "};",
  ].join("\n");

  window.Worker = function FrameWorker(url) {
    var worker = this, listeners = [], channel = new MessageChannel(), frame = document.createElement("iframe");
    this.onmessage = null;
    this.addEventListener = function (type, h) { if (type === "message") listeners.push(h); };
    this.removeEventListener = function (type, h) { listeners = listeners.filter(function (l) { return l !== h; }); };
    this.postMessage = function (data) { channel.port1.postMessage(data); };  // queued until the frame holds port2
    this.terminate = function () { channel.port1.close(); frame.remove(); };
    channel.port1.onmessage = function (m) {
      var event = {data: m.data};
      listeners.forEach(function (h) { h(event); });
      if (worker.onmessage) worker.onmessage(event);
    };
    frame.hidden = true;
    frame.srcdoc = "<script>" + FRAME + "<\/script><script src=\"" + new URL(url, location.href) + "\"><\/script>";
    frame.onload = function () { frame.contentWindow.postMessage("vitlab-port", "*", [channel.port2]); };
    document.body.appendChild(frame);
  };
})();
