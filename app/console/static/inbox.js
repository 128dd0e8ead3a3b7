// The console inbox, live: each `message` event of /console/inbox/events (the
// namespace's new mail) becomes the table's first row, built with DOM calls
// (text only, never HTML from the mail). With filters set, a row is added only
// when the recipient filter (if any) names one of its recipients; other
// filters show a notice instead, as the server would have to judge them.
(function () {
  "use strict";
  var table = document.getElementById("inbox");
  if (!table || !window.EventSource) return;
  var live = JSON.parse(table.getAttribute("data-live") || "{}");
  var csrf = table.getAttribute("data-csrf") || "";
  var body = table.tBodies[0];
  var status = document.getElementById("inbox-status");

  function cell(row, text, cls) {
    var td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    row.appendChild(td);
    return td;
  }

  function when(iso) {
    return iso.replace("T", " ").replace(/\.\d+Z$/, " UTC").replace(/Z$/, " UTC");
  }

  function add(m) {
    if (document.querySelector('tr[data-id="' + m.message_id + '"]')) return;
    var row = document.createElement("tr");
    row.setAttribute("data-id", m.message_id);
    row.className = "new";
    cell(row, when(m.received_at));
    cell(row, (m.to || []).join(", ") || "—", "addr");
    var subject = cell(row, "");
    var link = document.createElement("a");
    link.href = "/console/messages/" + encodeURIComponent(m.message_id);
    link.textContent = m.subject || "(no subject)";
    subject.appendChild(link);
    cell(row, m.from || "—", "wide addr");
    cell(row, String(m.attachments), "wide num");
    cell(row, m.run_marker || "—", "wide");
    var actions = cell(row, "");
    var form = document.createElement("form");
    form.method = "post";
    form.action = "/console/inbox/delete";
    [["csrf_token", csrf], ["message_id", m.message_id]].forEach(function (pair) {
      var input = document.createElement("input");
      input.type = "hidden";
      input.name = pair[0];
      input.value = pair[1];
      form.appendChild(input);
    });
    var button = document.createElement("button");
    button.type = "submit";
    button.className = "small";
    button.textContent = "Delete";
    form.appendChild(button);
    actions.appendChild(form);
    body.insertBefore(row, body.firstChild);
  }

  var events = new EventSource("/console/inbox/events");
  events.addEventListener("message", function (e) {
    var m = JSON.parse(e.data);
    var rcpt = (live.recipient || "").toLowerCase();
    var named = (m.to || []).concat(m.cc || []);
    if (live.others || (rcpt && named.indexOf(rcpt) < 0)) {
      status.textContent = "New mail arrived: apply the filters again to see it.";
      return;
    }
    add(m);
    status.textContent = "New mail: " + (m.subject || "(no subject)");
  });
})();
