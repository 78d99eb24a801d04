// Polls this controller's own admin endpoints once a second and draws them; nothing is loaded
// from anywhere else. Every number comes from the controller: the history from /v1/history (a
// point per second for the last minutes), the latest interval from /v1/buckets.
const $ = id => document.getElementById(id);
const esc = s => String(s).replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const fixed = (v, d) => (v == null || !isFinite(v)) ? '–' : Number(v).toFixed(d);
const rate = v => v >= 100 ? fixed(v, 0) : fixed(v, 1);
function ago(ms) {
  if (ms == null) return 'never';
  if (ms < 1000) return `${ms} ms ago`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s ago`;
  return `${Math.round(ms / 60000)} min ago`;
}
function span(ms) {
  if (ms == null) return '–';
  if (ms < 120000) return `${(ms / 1000).toFixed(0)} s`;
  if (ms < 7200000) return `${Math.round(ms / 60000)} min`;
  return `${(ms / 3600000).toFixed(1)} h`;
}

// How much trouble a bucket is in: its rank sorts the page, worst first.
function trouble(b) {
  const load = b.limit_rps > 0 ? b.offered_rps / b.limit_rps : 0;
  const over = load > 1 ? `offered ${load.toFixed(2)}× its limit` : `offered ${(load * 100).toFixed(0)}% of its limit`;
  if (b.mode !== 'shadow' && (b.real_drop_rps > 0.05 || b.drop_ratio > 0.001)) {
    const share = b.offered_rps > 0 ? b.real_drop_rps / b.offered_rps : b.drop_ratio;
    return { rank: 3, load, cls: 'bad', label: 'dropping', why: `${over}; ${(share * 100).toFixed(0)}% of its requests refused (429)` };
  }
  if (b.shadow_drop_rps > 0.05 || (b.mode === 'shadow' && b.drop_ratio > 0.001)) {
    return { rank: 2, load, cls: 'warn', label: 'would drop', why: `${over}; a shadow bucket: enforced, it would refuse ${rate(b.shadow_drop_rps)}/s` };
  }
  if (load > 0.8) return { rank: 1, load, cls: 'warn', label: 'near its limit', why: over };
  if (b.offered_rps <= 0) return { rank: 0, load, cls: 'idle', label: 'idle', why: 'no requests in the last interval' };
  return { rank: 0, load, cls: 'ok', label: 'ok', why: over };
}

// An inline SVG chart of `series` (each {values, color, dash, fill}) against `t` (Unix ms),
// from `now - windowMs` to `now`.
function chart(kind, t, series, now, windowMs) {
  const W = 360, H = 96, L = 40, R = 6, T = 6, B = 16, w = W - L - R, h = H - T - B;
  const from = now - windowMs;
  const keep = t.map((x, i) => x >= from ? i : -1).filter(i => i >= 0);
  let top = 0;
  for (const s of series) for (const i of keep) top = Math.max(top, s.values[i] || 0);
  top = top > 0 ? top * 1.15 : 1;
  const x = ms => (L + (ms - from) / windowMs * w).toFixed(1);
  const y = v => (T + h - Math.min(v, top) / top * h).toFixed(1);
  let out = `<svg class="chart" data-chart="${kind}" data-points="${keep.length}" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" role="img">`;
  out += `<line x1="${L}" x2="${W - R}" y1="${T + h}" y2="${T + h}" stroke="#ccc"/>`;
  out += `<line x1="${L}" x2="${W - R}" y1="${T + h / 2}" y2="${T + h / 2}" stroke="#eee"/>`;
  out += `<text x="${L - 4}" y="${T + 8}" text-anchor="end">${rate(top)}</text>`;
  out += `<text x="${L - 4}" y="${T + h}" text-anchor="end">0</text>`;
  out += `<text x="${L}" y="${H - 3}">−${span(windowMs)}</text><text x="${W - R}" y="${H - 3}" text-anchor="end">now</text>`;
  if (keep.length === 0) {
    out += `<text x="${L + w / 2}" y="${T + h / 2}" text-anchor="middle">collecting…</text>`;
  }
  for (const s of series) {
    if (keep.length === 0) break;
    const pts = keep.map(i => `${x(t[i])},${y(s.values[i] || 0)}`);
    if (s.fill) {
      const base = `${x(t[keep[keep.length - 1]])},${y(0)} ${x(t[keep[0]])},${y(0)}`;
      out += `<polygon data-series="${s.name}" fill="${s.color}" fill-opacity=".35" stroke="none" points="${pts.join(' ')} ${base}"/>`;
    } else {
      out += `<polyline data-series="${s.name}" fill="none" stroke="${s.color}" stroke-width="1.6"` +
        (s.dash ? ' stroke-dasharray="5 3"' : '') + ` points="${pts.join(' ')}"/>`;
    }
  }
  return out + '</svg>';
}

function bucketCard(b, hist, now, windowMs) {
  const st = trouble(b);
  const name = `${b.service}/${b.bucket}`;
  const t = hist ? hist.t_ms : [];
  const col = k => hist ? hist[k] : [];
  const rates = chart('rates', t, [
    { name: 'limit', values: col('limit_rps'), color: '#c62828', dash: true },
    { name: 'offered', values: col('offered_rps'), color: '#1565c0' },
    { name: 'admitted', values: col('admitted_rps'), color: '#2e7d32' },
  ], now, windowMs);
  const drops = chart('drops', t, [
    { name: 'real', values: col('real_drop_rps'), color: '#c62828', fill: true },
    { name: 'virtual', values: col('shadow_drop_rps'), color: '#b26a00' },
  ], now, windowMs);
  const num = (field, label, text) => `<div><dt>${label}</dt><dd data-field="${field}">${text}</dd></div>`;
  return `<article class="bucket st-${st.cls}" data-key="${esc(name)}" data-status="${st.label}" data-rank="${st.rank}">` +
    `<header><h3>${esc(name)}</h3><span class="badge">${esc(b.scope)}</span><span class="badge">${esc(b.mode)}</span>` +
    `<span class="badge">${esc(b.algorithm)}</span><span class="state ${st.cls}">${st.label}</span></header>` +
    `<div class="why">${esc(st.why)}</div>` +
    `<dl class="nums">` +
    num('limit', 'limit /s', rate(b.limit_rps)) +
    num('offered', 'offered /s', rate(b.offered_rps)) +
    num('admitted', 'admitted /s', rate(b.admitted_rps)) +
    num('drop_ratio', 'drop ratio', fixed(b.drop_ratio, 3)) +
    num('real_drops', 'real drops /s', rate(b.real_drop_rps)) +
    num('virtual_drops', 'virtual drops /s', rate(b.shadow_drop_rps)) +
    `</dl><div class="charts">` +
    `<figure><figcaption>requests per second</figcaption>${rates}</figure>` +
    `<figure><figcaption>drops per second: real (filled), virtual (line)</figcaption>${drops}</figure>` +
    `</div></article>`;
}

function tile(cls, value, label) {
  return `<div class="tile ${cls}"><b>${value}</b><span>${label}</span></div>`;
}

let refreshes = 0;
async function refresh() {
  try {
    const answers = await Promise.all([
      fetch('/v1/buckets'), fetch('/v1/history'), fetch('/v1/zones'), fetch('/v1/hosts'), fetch('/v1/rules/changes'),
    ]);
    for (const a of answers) {
      if (a.status === 401) throw new Error('signed out (the controller restarted?): reload the page to sign in again');
      if (!a.ok) throw new Error(`${a.url} answered ${a.status}`);
    }
    const [b, hist, z, h, ch] = await Promise.all(answers.map(a => a.json()));
    refreshes += 1;
    document.body.dataset.refreshes = refreshes;
    document.body.dataset.computed = z.computed;
    $('region').textContent = '· region ' + b.region;
    const converged = h.converged ? '<span class="ok">all hosts run it</span>'
      : '<span class="warn">not all hosts run it yet</span>';
    $('status').innerHTML = `rules version ${b.rules_version} (${converged}) · reports every ${b.interval_ms} ms · ` +
      `${z.computed} intervals computed, the last one ${ago(z.last_computed_age_ms)} · updated ${new Date().toLocaleTimeString()}`;

    // Buckets, worst first.
    const byKey = new Map(hist.buckets.map(x => [`${x.service}/${x.bucket}`, x]));
    // The charts span what the controller has, in whole minutes: one at first, up to the
    // ring's length (five minutes of one-second points).
    const oldest = Math.min(hist.now_ms, ...hist.buckets.map(x => x.t_ms.length ? x.t_ms[0] : hist.now_ms));
    const windowMs = Math.min(hist.slot_ms * hist.slots,
      Math.max(60000, Math.ceil((hist.now_ms - oldest) / 60000) * 60000));
    const sorted = b.buckets.map(k => ({ k, st: trouble(k) }))
      .sort((p, q) => q.st.rank - p.st.rank || q.st.load - p.st.load ||
        `${p.k.service}/${p.k.bucket}`.localeCompare(`${q.k.service}/${q.k.bucket}`));
    $('buckets').innerHTML = sorted.map(({ k }) =>
      bucketCard(k, byKey.get(`${k.service}/${k.bucket}`), hist.now_ms, windowMs)).join('') ||
      '<p class="note">No control-plane buckets (drop-ratio or adaptive-token-bucket) yet; ' +
      'local buckets are on each proxy\'s /metrics.</p>';

    // At a glance.
    const bad = sorted.filter(x => x.st.rank >= 2);
    const zonesOk = z.zones.filter(x => x.health === 'ok').length;
    const hostCount = Object.keys(h.hosts).length;
    const current = Object.values(h.hosts).filter(x => x.rules_version === h.rules_version).length;
    const livePeers = z.peers.filter(p => p.live).length;
    $('summary').innerHTML =
      tile(bad.length ? 'bad' : '', bad.length ? esc(`${bad[0].k.service}/${bad[0].k.bucket}`) : 'none',
        bad.length ? `in trouble (${bad.length} of ${sorted.length} buckets)` : `buckets in trouble (of ${sorted.length})`) +
      tile(zonesOk < z.zones.length ? 'bad' : '', `${zonesOk} of ${z.zones.length}`, 'zones reporting on time') +
      tile(current < hostCount ? 'warn' : '', `${current} of ${hostCount}`, `hosts on rules version ${h.rules_version}`) +
      (z.peers_configured + z.peers.length === 0 ? tile('', 'none', 'peer regions (this region alone)')
        : tile(livePeers < Math.max(z.peers_configured, z.peers.length) ? 'warn' : '',
          `${livePeers} of ${Math.max(z.peers_configured, z.peers.length)}`, 'peer regions heard from'));

    // The control plane's health.
    const instr = x => {
      const cls = { live: 'ok', late: 'warn', expired: 'bad', none: 'idle' }[x.instructions];
      const text = { live: 'live', late: 'late: expire in ' + span(Math.max(0, z.instruction_ttl_ms - x.instructions_age_ms)),
        expired: 'expired: hosts fail open', none: 'none sent yet' }[x.instructions];
      return `<td class="text ${cls}" data-field="instructions">${text}${x.instructions_age_ms != null ? ` (${ago(x.instructions_age_ms)})` : ''}</td>`;
    };
    $('zones').querySelector('tbody').innerHTML = z.zones.map(x =>
      `<tr data-zone="${esc(x.zone)}" data-health="${x.health}"><td>${esc(x.zone)}</td>` +
      `<td class="text ${{ ok: 'ok', late: 'warn', down: 'bad' }[x.health]}">${x.health}</td>` +
      `<td>${x.connected ? 'connected' : `<span class="bad">gone ${ago(x.disconnected_age_ms)}</span>`}</td>` +
      `<td data-field="report-age">${ago(x.last_report_age_ms)}</td><td>${x.clients}</td>` +
      `<td>${x.hosts_current} of ${x.hosts}</td>${instr(x)}<td>${x.instructions_missed}</td></tr>`).join('') ||
      '<tr><td colspan="8">no aggregator has reported yet</td></tr>';
    const peers = z.peers.map(p =>
      `<tr data-region="${esc(p.region)}"><td>${esc(p.region)}</td><td class="text">peer</td><td>${ago(p.last_heard_age_ms)}</td>` +
      `<td class="text ${p.live ? 'ok' : 'bad'}">${p.live ? 'live' : 'silent: left out of global sums'}</td></tr>`).join('');
    $('regions').querySelector('tbody').innerHTML =
      `<tr data-region="${esc(z.region)}"><td>${esc(z.region)}</td><td class="text">this controller</td>` +
      `<td>computed ${ago(z.last_computed_age_ms)}</td><td class="text">${z.zones_connected} aggregator stream(s)</td></tr>` + peers +
      (z.peers_configured > z.peers.length ? `<tr><td colspan="4" class="note">${z.peers_configured - z.peers.length} configured peer(s) not heard from yet</td></tr>` : '');

    // The rollout of the rules.
    const total = Math.max(hostCount, 1);
    $('rollout').innerHTML = `<p>Rules version <b>${h.rules_version}</b>, here for ${span(h.rules_version_age_ms)}: ` +
      `${current} of ${hostCount} hosts run it.</p>` +
      h.rollout.map(r => `<div data-version="${r.rules_version}"><span class="bar${r.rules_version === h.rules_version ? '' : ' old'}" ` +
        `style="width:${(r.hosts / total * 240).toFixed(0)}px"></span>version ${r.rules_version}: ${r.hosts} host(s)` +
        `${r.rules_version === h.rules_version ? ' (current)' : ''}</div>`).join('');
    $('hosts').querySelector('tbody').innerHTML = Object.entries(h.hosts).map(([id, v]) =>
      `<tr><td>${esc(id)}</td><td>${esc(v.zone)}</td>` +
      `<td class="${v.rules_version === h.rules_version ? 'ok' : 'warn'}">${v.rules_version}</td><td>${span(v.version_age_ms)}</td></tr>`
    ).join('') || '<tr><td colspan="4">no hosts connected</td></tr>';

    // The rules store's audit log.
    $('changes').innerHTML = ch.source == null
      ? '<p class="note">No audit log was given to this controller: spillway up and spillway demo give their rules store\'s; ' +
        'a controller run on its own (-c FILE or --database) does not show one yet.</p>'
      : ch.changes.length === 0 ? '<p class="note">No changes yet.</p>'
      : '<table><thead><tr><th>version</th><th class="text">when</th><th class="text">who</th><th class="text">what</th>' +
        '<th class="text">change</th><th class="text">why</th></tr></thead><tbody>' +
        ch.changes.map(c => `<tr><td>${c.version}</td><td class="text when">${esc(c.at)}</td><td class="text">${esc(c.actor)}</td>` +
          `<td class="text">${esc(c.action)}</td><td class="text">${esc(c.summary)}</td><td class="text">${esc(c.reason || '')}</td></tr>`).join('') +
        '</tbody></table>';
  } catch (e) {
    $('status').innerHTML = `<span class="bad">cannot reach the controller: ${esc(e.message || e)}</span>`;
  }
}
refresh();
setInterval(refresh, 1000);
