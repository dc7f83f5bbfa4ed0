// crossguard admin: live rows on the blocked-responses page. The page works without this
// script; it only adds rows as the server announces them (Server-Sent Events). Each row
// arrives as markup the server rendered and escaped, exactly like the page's own rows.
'use strict';

(function () {
  const rows = document.getElementById('rows');
  const status = document.getElementById('live');
  if (!rows || !rows.dataset.live || !status || !window.EventSource) {
    return;
  }
  let added = 0;
  const say = (text, state) => {
    status.textContent = text;
    status.className = 'live ' + state;
    status.hidden = false;
  };
  const source = new EventSource(rows.dataset.live);
  source.addEventListener('open', () => {
    say(added ? 'Live: ' + added + ' new since this page loaded' : 'Live: new blocks appear here as they happen', 'on');
  });
  source.addEventListener('error', () => say('Live updates interrupted; reconnecting…', 'off'));
  source.addEventListener('audit', (event) => {
    const template = document.createElement('template');
    template.innerHTML = event.data;
    const row = template.content.firstElementChild;
    if (!row || row.tagName !== 'TR') {
      return;
    }
    const empty = rows.querySelector('tr.empty');
    if (empty) {
      empty.remove();
    }
    row.classList.add('fresh');
    rows.prepend(row);
    added += 1;
    say('Live: ' + added + ' new since this page loaded', 'on');
  });
  source.addEventListener('lagged', (event) => {
    say('Live: ' + event.data + ' records were missed; reload the page to see them', 'off');
  });
})();
