// The demo page: UI only. Every GPU call runs in worker.js.
const $ = (id) => document.getElementById(id);

const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
let nextId = 1;
const pending = new Map();

// call(op, args, onEvent) -> Promise of the op's result; onEvent gets 'progress' / 'tokens' messages.
function call(op, args, onEvent) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject, onEvent });
    worker.postMessage({ id, op, args });
  });
}

worker.onmessage = (e) => {
  const m = e.data;
  const p = pending.get(m.id);
  if (!p) return;
  if (m.type === 'result') { pending.delete(m.id); p.resolve(m.result); }
  else if (m.type === 'error') { pending.delete(m.id); p.reject(new Error(m.message)); }
  else if (p.onEvent) p.onEvent(m);
};
worker.onerror = (e) => fatal(`The worker failed: ${e.message || 'could not start (module workers need Chrome 80+ / Firefox 114+)'}`);

function fatal(msg) {
  $('fatal').textContent = msg;
  $('fatal').hidden = false;
}

function showError(msg) {
  $('error').textContent = msg;
  $('error').hidden = !msg;
}

const state = { loaded: null, busy: false };

function setBusy(busy) {
  state.busy = busy;
  $('load').disabled = busy;
  $('generate').disabled = busy || !state.loaded;
  $('bench').disabled = busy || !state.loaded;
  $('stop').disabled = !busy;
}

function feature(name, on) {
  return `<span class="feat ${on ? 'on' : 'off'}">${name}</span>`;
}

function showAdapter(info) {
  const offered = new Set(info.features);
  $('adapter').innerHTML =
    `<b>Adapter:</b> <span id="adapter-name">${escapeHtml(info.name || 'unnamed')}</span> ` +
    `<span class="muted">(${escapeHtml(info.backend)}, ${escapeHtml(info.device_type)}${info.driver_info ? ', ' + escapeHtml(info.driver_info) : ''})</span><br>` +
    `<b>Features:</b> ${feature('shader-f16', offered.has('shader-f16'))}${feature('subgroups', offered.has('subgroups'))}${feature('timestamp-query', offered.has('timestamp-query'))} ` +
    `<span class="muted">kernels: ${info.kernels_f16 ? 'native f16' : 'packed f16 (u32)'}, ${info.kernels_subgroups ? 'subgroup' : 'workgroup'} reductions; ` +
    `max storage binding ${(info.max_storage_buffer_binding_size / 2 ** 20).toFixed(0)} MiB, max buffer ${(info.max_buffer_size / 2 ** 20).toFixed(0)} MiB</span>`;
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
}

function source(urlId, filesId, fileId) {
  const file = fileId && $(fileId).files;
  if (file && file.length) return file[0];
  const files = $(filesId).files;
  if (files && files.length) return Array.from(files);
  const url = $(urlId).value.trim();
  return url ? new URL(url, location.href).href : null;
}

// --- sizes before downloading: HEAD requests (Content-Length), or the Cache API when cached -------
const CACHE_NAME = 'domino-models-v1'; // as crates/web/js/files.js

function isGgufUrl(url) {
  try { return new URL(url).pathname.toLowerCase().endsWith('.gguf'); } catch (_) { return false; }
}

// The files a load of this URL downloads: a .gguf file, or a folder's config and weights, and for a
// drafter its prompt-lookup table where the folder has one (optional: crates/web/js/files.js).
function downloadUrls(url, drafter) {
  if (isGgufUrl(url)) return [{ url, optional: false }];
  const base = url.endsWith('/') ? url : url + '/';
  const files = [['config.json', false], ['model.safetensors', false], ...(drafter ? [['lookup-ngrams.safetensors', true]] : [])];
  return files.map(([n, optional]) => ({ url: base + n, optional }));
}

// { bytes, cached } of one URL; bytes null when the server gives no size. An optional file the
// server lacks downloads nothing: 0 bytes, counted as cached.
async function urlSize({ url, optional }) {
  try {
    const cache = typeof caches !== 'undefined' ? await caches.open(CACHE_NAME) : null;
    const hit = cache && await cache.match(url);
    if (hit) return { bytes: (await hit.blob()).size, cached: true };
  } catch (_) { /* no Cache API: ask the server */ }
  const r = await fetch(url, { method: 'HEAD' });
  if (optional && r.status === 404) return { bytes: 0, cached: true };
  if (!r.ok) throw new Error(`HTTP ${r.status}`);
  const n = r.headers.get('content-length');
  return { bytes: n === null ? null : Number(n), cached: false };
}

async function showSize(urlId, filesId, fileId, outId, drafter = false) {
  const out = $(outId);
  delete out.dataset.bytes;
  out.dataset.state = 'pending';
  const src = source(urlId, filesId, fileId);
  if (!src) { out.textContent = ''; out.dataset.state = 'none'; return; }
  if (typeof src !== 'string') {
    const files = Array.isArray(src) ? src : [src];
    const bytes = files.reduce((s, f) => s + f.size, 0);
    out.textContent = `${mb(bytes)} on this computer`;
    out.dataset.bytes = String(bytes);
    out.dataset.state = 'local';
    return;
  }
  out.textContent = 'size…';
  try {
    const sizes = await Promise.all(downloadUrls(src, drafter).map(urlSize));
    if (source(urlId, filesId, fileId) !== src) return; // the field changed meanwhile
    const bytes = sizes.reduce((s, x) => s + (x.bytes || 0), 0);
    const cached = sizes.every((x) => x.cached);
    const unknown = sizes.some((x) => x.bytes === null);
    out.textContent = cached ? `${mb(bytes)}, in the browser cache (no download)` : `${unknown ? 'at least ' : ''}${mb(bytes)} to download`;
    out.dataset.bytes = String(bytes);
    out.dataset.state = cached ? 'cached' : 'remote';
  } catch (e) {
    out.textContent = `not reachable (${e.message})`;
    out.dataset.state = 'error';
  }
}

function showSizes() {
  return Promise.all([
    showSize('model-url', 'model-files', 'model-file', 'model-size'),
    showSize('draft-url', 'draft-files', null, 'draft-size', true),
  ]);
}

function mb(n) { return (n / 1e6).toFixed(1) + ' MB'; }

async function load() {
  showError('');
  const model = source('model-url', 'model-files', 'model-file');
  if (!model) { showError('Choose a model: a .gguf file or a folder, by URL or from this computer.'); return; }
  const draft = source('draft-url', 'draft-files');
  setBusy(true);
  $('stop').disabled = true;
  $('load-status').textContent = 'loading…';
  const t0 = performance.now();
  try {
    const info = await call('load', { model, draft, dtype: $('dtype').value }, (m) => {
      if (m.type !== 'progress') return;
      $('progress').value = m.total ? m.loaded / m.total : 0;
      const verb = m.phase === 'upload' ? 'uploading to the GPU' : 'downloading';
      $('load-status').textContent = `${verb} ${m.file}: ${mb(m.loaded)} / ${mb(m.total)}`;
    });
    state.loaded = info;
    window.dominoLoaded = info; // the load summary, for the console and the browser test
    $('progress').value = 1;
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    $('load-status').textContent = `loaded ${info.model}` + (info.drafter ? ` + ${info.drafter_kind} drafter (block ${info.block_size})` : '') + ` in ${secs} s`;
    $('load-status').dataset.state = 'loaded';
    const hasDraft = !!info.drafter;
    document.querySelector('input[value=backbone]').disabled = !hasDraft;
    document.querySelector('input[value=domino]').disabled = !(hasDraft && info.drafter_kind === 'domino');
    $('backbone-label').textContent = info.drafter_kind === 'dflash' ? 'DFlash' : 'DFlash backbone (no head)';
    const mode = hasDraft ? (info.drafter_kind === 'domino' ? 'domino' : 'backbone') : 'plain';
    document.querySelector(`input[value=${mode}]`).checked = true;
    $('chat').disabled = !info.has_chat_template;
    $('chat').checked = info.has_chat_template;
    showSizes(); // now cached
  } catch (err) {
    $('load-status').textContent = 'load failed';
    $('load-status').dataset.state = 'failed';
    showError(err.message);
  } finally {
    setBusy(false);
  }
}

function generateArgs() {
  const mode = document.querySelector('input[name=mode]:checked').value;
  const num = (id) => Number($(id).value);
  return {
    prompt: $('prompt').value,
    chat: $('chat').checked,
    maxTokens: num('max-tokens'),
    temperature: num('temperature'),
    topP: num('top-p'),
    topK: num('top-k'),
    seed: num('seed'),
    ignoreEos: $('ignore-eos').checked,
    draft: mode !== 'plain',
    noHead: mode === 'backbone' && state.loaded.drafter_kind === 'domino',
    draftLen: $('draft-len').value === 'auto' ? 'auto' : num('draft-len'),
    lookup: mode !== 'plain' && $('lookup').checked,
  };
}

async function generate() {
  showError('');
  $('output').textContent = '';
  $('summary').textContent = '';
  $('output-ids').textContent = '';
  $('result-json').textContent = '';
  $('summary').dataset.state = 'running';
  setBusy(true);
  const args = generateArgs();
  let tokens = 0, firstAt = null, rounds = 0, roundTokens = 0;
  try {
    const r = await call('generate', args, (m) => {
      if (m.type !== 'tokens') return;
      $('output').textContent += m.texts.join('');
      tokens += m.ids.length;
      if (firstAt === null) firstAt = m.t;
      else if (args.draft) { rounds += 1; roundTokens += m.ids.length; }
      const secs = (m.t - firstAt) / 1000;
      const tps = secs > 0 ? (tokens - 1) / secs : 0;
      $('live').textContent = `${tokens} tokens, ${tps.toFixed(1)} tok/s` + (rounds ? `, mean acceptance ${(roundTokens / rounds).toFixed(2)}` : '');
    });
    const s = r.stats;
    $('output-ids').textContent = JSON.stringify(r.output_ids);
    $('result-json').textContent = JSON.stringify(r);
    $('summary').textContent =
      `${s.prompt_tokens} prompt tokens at ${s.prefill_tokens_per_s.toFixed(1)} tok/s, ` +
      `${s.generated_tokens} generated at ${s.decode_tokens_per_s.toFixed(1)} tok/s (${r.stop_reason})` +
      (s.rounds ? `; ${s.rounds} rounds, mean acceptance ${s.mean_acceptance.toFixed(2)}, block ${s.block_size}` : '');
    $('summary').dataset.state = 'done';
  } catch (err) {
    $('summary').dataset.state = 'failed';
    showError(err.message);
  } finally {
    setBusy(false);
  }
}

async function bench() {
  showError('');
  setBusy(true);
  $('stop').disabled = true;
  $('bench-out').hidden = true;
  try {
    const report = await call('bench', { maxTokens: Number($('max-tokens').value), runs: 2, hostname: location.hostname }, (m) => {
      if (m.type === 'progress') $('live').textContent = `bench ${m.loaded}/${m.total}: ${m.file}`;
    });
    const text = JSON.stringify(report, null, 2);
    $('bench-json').textContent = text;
    $('bench-download').href = URL.createObjectURL(new Blob([text], { type: 'application/json' }));
    const a = report.adapters[0];
    $('bench-table').innerHTML = '<tr><th>mode</th><th>decode tok/s</th><th>prefill tok/s</th><th>speedup</th><th>mean acceptance</th></tr>' +
      a.modes.map((m) => `<tr><td>${escapeHtml(m.mode)}</td><td>${m.decode_tokens_per_s.toFixed(2)}</td><td>${m.prefill_tokens_per_s.toFixed(1)}</td>` +
        `<td>${m.speedup_over_plain.toFixed(2)}x</td><td>${m.mean_acceptance.toFixed(2)}</td></tr>`).join('');
    $('bench-out').hidden = false;
    $('bench-out').dataset.state = 'done';
    $('live').textContent = `bench done on ${a.adapter.name}`;
  } catch (err) {
    showError(err.message);
  } finally {
    setBusy(false);
  }
}

$('load').onclick = load;
$('generate').onclick = generate;
$('bench').onclick = bench;
$('stop').onclick = () => worker.postMessage({ op: 'stop' });

(async () => {
  if (!('gpu' in navigator)) {
    fatal('WebGPU is not available in this browser (navigator.gpu is missing). Use Chrome or Edge 113+, ' +
      'Safari 26+, or Firefox 141+ on Windows, over https or localhost.');
    $('adapter').textContent = 'No WebGPU.';
    return;
  }
  try {
    const info = await call('create');
    showAdapter(info);
    $('adapter').dataset.state = 'ready';
    setBusy(false);
    // ?model=URL&draft=URL replace the defaults (the page's own models/); a model without a draft
    // leaves the drafter empty.
    const q = new URLSearchParams(location.search);
    if (q.get('dtype')) $('dtype').value = q.get('dtype');
    if (q.get('model')) {
      $('model-url').value = q.get('model');
      $('draft-url').value = q.get('draft') || '';
    }
    for (const id of ['model-url', 'model-file', 'model-files', 'draft-url', 'draft-files']) $(id).addEventListener('change', showSizes);
    await showSizes();
  } catch (err) {
    $('adapter').textContent = 'WebGPU could not start.';
    fatal(err.message);
  }
})();
