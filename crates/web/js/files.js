// Models for the browser build: a folder (a base URL, or File objects from a folder picker) or one
// GGUF file (a URL ending in .gguf, or a File). URLs are fetched once and kept in the Cache API. Either way every file ends up as a Blob, which Chromium keeps out of
// the JS heap (on disk when large); the wasm side reads one tensor at a time from it with readSync,
// so the weights are never held whole in wasm memory.

const CACHE_NAME = 'domino-models-v1';

// A drafter folder's static n-gram table for prompt lookup: optional, and not a weight file.
const LOOKUP_TABLE = 'lookup-ngrams.safetensors';
// The files a model folder may have besides its weights; config.json is the only required one.
const OPTIONAL = ['tokenizer.json', 'tokenizer_config.json', 'generation_config.json'];
const INDEX = 'model.safetensors.index.json';

function joinUrl(base, name) {
  const b = String(base);
  return b.endsWith('/') ? b + name : b + '/' + name;
}

async function openCache() {
  try {
    return typeof caches !== 'undefined' ? await caches.open(CACHE_NAME) : null;
  } catch (_) {
    return null; // no Cache API (insecure context, private mode): fetch every time
  }
}

// A cached response, or a fetched one written through to the cache while counting its bytes.
async function fetchToBlob(url, cache, onBytes) {
  if (cache) {
    const hit = await cache.match(url);
    if (hit) {
      const blob = await hit.blob();
      onBytes(blob.size, blob.size, true);
      return blob;
    }
  }
  let resp;
  try {
    resp = await fetch(url);
  } catch (e) {
    throw new Error(`${url}: fetch failed (${e.message || e})`);
  }
  if (resp.status === 404) return null;
  if (!resp.ok) throw new Error(`${url}: HTTP ${resp.status} ${resp.statusText}`);
  const total = Number(resp.headers.get('content-length')) || 0;
  onBytes(0, total, false);
  let loaded = 0;
  const counted = resp.body.pipeThrough(new TransformStream({
    transform(chunk, ctl) {
      loaded += chunk.byteLength;
      onBytes(loaded, Math.max(total, loaded), false);
      ctl.enqueue(chunk);
    },
  }));
  if (cache) {
    const headers = { 'content-type': resp.headers.get('content-type') || 'application/octet-stream' };
    await cache.put(url, new Response(counted, { headers }));
    const stored = await cache.match(url);
    if (stored) return await stored.blob();
  }
  return await new Response(counted).blob();
}

// Open a model folder: returns { name, files: Map<fileName, Blob>, weights: [fileName...] }.
// onProgress(loadedBytes, totalBytes, fileName) follows the download (cached files count at once).
// A GGUF source opens as { name, files: Map{file: Blob}, weights: [file], gguf: file }.
// `drafter`: a URL folder is also asked for the drafter's optional lookup table.
export async function openFolder(source, onProgress, drafter) {
  const progress = typeof onProgress === 'function' ? onProgress : () => {};
  if (typeof Blob !== 'undefined' && source instanceof Blob) {
    if (!isGguf(source.name || '')) throw new Error(`${source.name || 'the file'}: a single file must be a .gguf (or pass a folder's files)`);
    return ggufFile(source, progress);
  }
  if (Array.isArray(source) || (typeof FileList !== 'undefined' && source instanceof FileList)) {
    return fromFiles(Array.from(source), progress);
  }
  if (typeof source === 'string') return isGguf(source) ? fromGgufUrl(source, progress) : fromUrl(source, progress, drafter ? [LOOKUP_TABLE] : []);
  throw new Error('model/draft: expected a URL (a folder, or a .gguf file), a File of a .gguf, or an array of File objects');
}

// A .gguf name or URL (its path, without query or fragment).
export function isGguf(nameOrUrl) {
  let path = String(nameOrUrl);
  try { path = new URL(path, 'http://x/').pathname; } catch (_) { /* a plain name */ }
  return path.toLowerCase().endsWith('.gguf');
}

function baseName(url) {
  let path = String(url);
  try { path = new URL(path, 'http://x/').pathname; } catch (_) { /* keep */ }
  return decodeURIComponent(path.split('/').filter(Boolean).pop() || path);
}

function ggufFile(file, progress) {
  progress(file.size, file.size, file.name);
  return { name: file.name, files: new Map([[file.name, file]]), weights: [file.name], gguf: file.name, local: true };
}

async function fromGgufUrl(url, progress) {
  const cache = await openCache();
  const name = baseName(url);
  const blob = await fetchToBlob(url, cache, (loaded, total) => progress(loaded, total, name));
  if (!blob) throw new Error(`${url}: not found (HTTP 404)`);
  return { name, files: new Map([[name, blob]]), weights: [name], gguf: name, local: false };
}

function fromFiles(list, progress) {
  const files = new Map();
  let folder = '';
  for (const f of list) {
    if (!(f instanceof Blob)) throw new Error('model/draft: the array must hold File objects');
    const rel = f.webkitRelativePath || f.name;
    if (!folder && rel.includes('/')) folder = rel.split('/')[0];
    files.set(f.name, f);
  }
  // A folder without config.json holding exactly one .gguf is that GGUF file (as natively).
  const ggufs = [...files.keys()].filter(isGguf);
  if (!files.has('config.json') && ggufs.length === 1) return ggufFile(files.get(ggufs[0]), progress);
  if (!files.has('config.json') && ggufs.length > 1) throw new Error(`${folder || 'the chosen files'}: ${ggufs.length} .gguf files (${ggufs.join(', ')}); choose one`);
  if (!files.has('config.json')) throw new Error(`${folder || 'the chosen files'}: no config.json`);
  let weights;
  if (files.has(INDEX)) {
    weights = null; // resolved from the index by the caller (it reads the index text)
  } else {
    weights = [...files.keys()].filter((n) => n.endsWith('.safetensors') && n !== LOOKUP_TABLE).sort();
    if (weights.length === 0) throw new Error(`${folder || 'the chosen files'}: no *.safetensors file`);
  }
  const total = [...files.values()].reduce((s, b) => s + b.size, 0);
  progress(total, total, folder || 'files');
  return { name: folder || 'local files', files, weights, local: true };
}

async function fromUrl(base, progress, extraOptional) {
  const cache = await openCache();
  const files = new Map();
  const sizes = new Map();
  const report = (name) => (loaded, total) => {
    sizes.set(name, [loaded, total]);
    let l = 0, t = 0;
    for (const [a, b] of sizes.values()) { l += a; t += b; }
    progress(l, t, name);
  };
  const get = async (name, required) => {
    const blob = await fetchToBlob(joinUrl(base, name), cache, report(name));
    if (!blob && required) throw new Error(`${joinUrl(base, name)}: not found (HTTP 404)`);
    if (blob) files.set(name, blob);
    return blob;
  };
  await get('config.json', true);
  await Promise.all([...OPTIONAL, ...extraOptional].map((n) => get(n, false)));
  let weights;
  const index = await get(INDEX, false);
  if (index) {
    weights = shardsFromIndex(await index.text(), joinUrl(base, INDEX));
  } else {
    weights = ['model.safetensors'];
  }
  for (const w of weights) await get(w, true);
  return { name: base, files, weights, local: false };
}

function shardsFromIndex(text, where) {
  let v;
  try { v = JSON.parse(text); } catch (e) { throw new Error(`${where}: malformed JSON: ${e.message}`); }
  if (!v || typeof v.weight_map !== 'object') throw new Error(`${where}: missing 'weight_map' object`);
  return [...new Set(Object.values(v.weight_map).filter((x) => typeof x === 'string'))].sort();
}

// The weight files of an opened folder (shards from the index when the folder has one).
export async function weightFiles(folder) {
  if (folder.weights) return folder.weights;
  const index = folder.files.get(INDEX);
  const names = shardsFromIndex(await index.text(), INDEX);
  for (const n of names) if (!folder.files.has(n)) throw new Error(`${n}: listed in ${INDEX} but not among the chosen files`);
  return names;
}

// A small file's bytes (config, tokenizer), or undefined when the folder lacks it.
export async function fileBytes(folder, name) {
  const b = folder.files.get(name);
  return b ? new Uint8Array(await b.arrayBuffer()) : undefined;
}

export function fileBlob(folder, name) {
  return folder.files.get(name);
}

// Synchronous ranged read (FileReaderSync exists only in workers: the loader runs in one).
let reader = null;
export function readSync(blob, start, end) {
  if (typeof FileReaderSync === 'undefined') {
    throw new Error('Domino.load must run in a Web Worker: weights are read tensor by tensor with FileReaderSync');
  }
  reader = reader || new FileReaderSync();
  return new Uint8Array(reader.readAsArrayBuffer(blob.slice(start, end)));
}
